package objects

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestBucketLocationAndAccess: GetBucketLocation and HeadBucket tell a
// bucket that does not exist (404 NoSuchBucket; HEAD has no body, so
// only its status) from another user's (403 AccessDenied), which clients
// such as rclone and the aws cli rely on to choose between creating the
// bucket and giving up.
func TestBucketLocationAndAccess(t *testing.T) {
	e := newEnv(t, false)
	mkBucket(t, e.alice, "alice-loc")
	mkBucket(t, e.bob, "bob-loc")
	if _, err := e.alice.GetBucketLocation(ctx, &s3.GetBucketLocationInput{Bucket: aws.String("alice-loc")}); err != nil {
		t.Fatalf("location of one's own bucket: %v", err)
	}
	_, err := e.alice.GetBucketLocation(ctx, &s3.GetBucketLocationInput{Bucket: aws.String("no-such-loc")})
	if httpStatus(err) != 404 || code(err) != "NoSuchBucket" {
		t.Errorf("location of a missing bucket: %v, want 404 NoSuchBucket", err)
	}
	_, err = e.alice.GetBucketLocation(ctx, &s3.GetBucketLocationInput{Bucket: aws.String("bob-loc")})
	if httpStatus(err) != 403 || code(err) != "AccessDenied" {
		t.Errorf("location of another user's bucket: %v, want 403 AccessDenied", err)
	}
	_, err = e.alice.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("no-such-loc")})
	if httpStatus(err) != 404 {
		t.Errorf("HEAD of a missing bucket: %v, want 404", err)
	}
	_, err = e.alice.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("bob-loc")})
	if httpStatus(err) != 403 {
		t.Errorf("HEAD of another user's bucket: %v, want 403", err)
	}
}

// TestTaggingAndACLNotImplemented: object tagging and object ACLs, which
// basalt does not keep, answer a clean 501 NotImplemented (not a 500 a
// client would retry, nor a success that pretends to keep them). A PUT
// or copy carrying x-amz-tagging succeeds without tags (docs/objects.md:
// the header is ignored). The bucket ACL is the owner's.
func TestTaggingAndACLNotImplemented(t *testing.T) {
	e := newEnv(t, false)
	c := e.alice
	mkBucket(t, c, "tags")
	put(t, c, "tags", "k", "x")
	tagging := &types.Tagging{TagSet: []types.Tag{{Key: aws.String("a"), Value: aws.String("b")}}}
	for name, call := range map[string]func() error{
		"GetObjectTagging": func() error {
			_, err := c.GetObjectTagging(ctx, &s3.GetObjectTaggingInput{Bucket: aws.String("tags"), Key: aws.String("k")})
			return err
		},
		"PutObjectTagging": func() error {
			_, err := c.PutObjectTagging(ctx, &s3.PutObjectTaggingInput{Bucket: aws.String("tags"), Key: aws.String("k"), Tagging: tagging})
			return err
		},
		"DeleteObjectTagging": func() error {
			_, err := c.DeleteObjectTagging(ctx, &s3.DeleteObjectTaggingInput{Bucket: aws.String("tags"), Key: aws.String("k")})
			return err
		},
		"GetBucketTagging": func() error {
			_, err := c.GetBucketTagging(ctx, &s3.GetBucketTaggingInput{Bucket: aws.String("tags")})
			return err
		},
		"PutBucketTagging": func() error {
			_, err := c.PutBucketTagging(ctx, &s3.PutBucketTaggingInput{Bucket: aws.String("tags"), Tagging: tagging})
			return err
		},
		"GetObjectAcl": func() error {
			_, err := c.GetObjectAcl(ctx, &s3.GetObjectAclInput{Bucket: aws.String("tags"), Key: aws.String("k")})
			return err
		},
		"PutObjectAcl": func() error {
			_, err := c.PutObjectAcl(ctx, &s3.PutObjectAclInput{Bucket: aws.String("tags"), Key: aws.String("k"),
				ACL: types.ObjectCannedACLPrivate})
			return err
		},
	} {
		if err := call(); httpStatus(err) != 501 || code(err) != "NotImplemented" {
			t.Errorf("%s: %v, want 501 NotImplemented", name, err)
		}
	}
	if _, err := c.GetBucketAcl(ctx, &s3.GetBucketAclInput{Bucket: aws.String("tags")}); err != nil {
		t.Errorf("GetBucketAcl: %v", err)
	}
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("tags"), Key: aws.String("tagged"),
		Body: strings.NewReader("t"), Tagging: aws.String("a=b")}); err != nil {
		t.Fatalf("PUT with x-amz-tagging: %v", err)
	}
	if _, err := c.CopyObject(ctx, &s3.CopyObjectInput{Bucket: aws.String("tags"), Key: aws.String("tagged2"),
		CopySource: aws.String("tags/tagged"), TaggingDirective: types.TaggingDirectiveReplace, Tagging: aws.String("c=d")}); err != nil {
		t.Fatalf("copy with x-amz-tagging: %v", err)
	}
	g, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("tags"), Key: aws.String("tagged2")})
	if err != nil {
		t.Fatal(err)
	}
	g.Body.Close()
	if aws.ToInt32(g.TagCount) != 0 {
		t.Errorf("tag count %d of an object basalt keeps no tags for", aws.ToInt32(g.TagCount))
	}
}
