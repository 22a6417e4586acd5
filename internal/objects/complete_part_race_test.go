package objects

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// onStep makes f the test's stepHook for the rest of the test.
func onStep(t *testing.T, f func(op, name string)) {
	stepHook.Store(&f)
	t.Cleanup(func() { stepHook.Store(nil) })
}

// TestCompleteRacesPartReupload: an UploadPart of a part number that a
// CompleteMultipartUpload is joining replaces the part's record and
// removes the part file it replaces. The Complete then either joins a
// whole part whose ETag is the one its request lists, or — the part the
// client listed is gone — answers InvalidPart (400), as S3 does for a part
// whose ETag no longer matches; the upload stays, and a Complete listing
// the new part's ETag succeeds. Before, the Complete found the old part's
// file gone and answered 500 InternalError.
func TestCompleteRacesPartReupload(t *testing.T) {
	e := newEnv(t, false)
	const bucket = "mprace"
	mkBucket(t, e.alice, bucket)
	big := func(c string) string { return strings.Repeat(c, 5<<20) }
	uploadPart := func(key string, id *string, n int32, body string) *s3.UploadPartOutput {
		t.Helper()
		out, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key),
			UploadId: id, PartNumber: aws.Int32(n), Body: strings.NewReader(body)})
		if err != nil {
			t.Errorf("upload part %d: %v", n, err)
			return nil
		}
		return out
	}
	create := func(key string) *string {
		t.Helper()
		up, err := e.alice.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		if err != nil {
			t.Fatal(err)
		}
		return up.UploadId
	}
	complete := func(key string, id *string, etags ...*string) error {
		var ps []types.CompletedPart
		for i, etag := range etags {
			ps = append(ps, types.CompletedPart{PartNumber: aws.Int32(int32(i + 1)), ETag: etag})
		}
		_, err := e.alice.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(bucket),
			Key: aws.String(key), UploadId: id, MultipartUpload: &types.CompletedMultipartUpload{Parts: ps}})
		return err
	}
	// reuploadWhileJoining re-uploads part 1 with body once the Complete
	// is about to read part 1's file.
	reuploadWhileJoining := func(key string, id *string, body string) {
		var once sync.Once
		onStep(t, func(op, name string) {
			if op == "complete part" && strings.HasPrefix(filepath.Base(name), "1.") {
				once.Do(func() { uploadPart(key, id, 1, body) })
			}
		})
	}

	// Part 1 replaced by other bytes: the listed part is gone.
	id := create("k")
	p1 := uploadPart("k", id, 1, big("a"))
	p2 := uploadPart("k", id, 2, "tail")
	reuploadWhileJoining("k", id, big("b"))
	err := complete("k", id, p1.ETag, p2.ETag)
	stepHook.Store(nil)
	switch code(err) {
	case "InvalidPart":
		_, gerr := e.alice.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("k")})
		if code(gerr) != "NotFound" && code(gerr) != "NoSuchKey" {
			t.Fatalf("HEAD after a Complete that failed: %v, want no object", gerr)
		}
	case "":
		if got := get(t, e.alice, bucket, "k"); got != big("a")+"tail" {
			t.Fatalf("completed object of %d bytes is not the parts the Complete listed", len(got))
		}
	default:
		t.Fatalf("Complete racing a re-upload of its part 1: %v, want InvalidPart or the listed parts", err)
	}
	if err == nil {
		t.Log("complete used the old part")
	} else {
		// The upload is still there, with the new part 1.
		lp, lerr := e.alice.ListParts(ctx, &s3.ListPartsInput{Bucket: aws.String(bucket), Key: aws.String("k"), UploadId: id})
		if lerr != nil {
			t.Fatalf("list parts after InvalidPart: %v", lerr)
		}
		if len(lp.Parts) != 2 || aws.ToString(lp.Parts[0].ETag) == aws.ToString(p1.ETag) {
			t.Fatalf("parts after the re-upload: %+v", lp.Parts)
		}
		if err := complete("k", id, lp.Parts[0].ETag, p2.ETag); err != nil {
			t.Fatalf("complete with the new part's ETag: %v", err)
		}
		if got := get(t, e.alice, bucket, "k"); got != big("b")+"tail" {
			t.Fatalf("object of %d bytes, want the new part 1 and the tail", len(got))
		}
	}

	// Part 1 replaced by the same bytes (same ETag): the Complete joins
	// the new copy.
	id = create("same")
	p1 = uploadPart("same", id, 1, big("c"))
	p2 = uploadPart("same", id, 2, "tail")
	reuploadWhileJoining("same", id, big("c"))
	err = complete("same", id, p1.ETag, p2.ETag)
	stepHook.Store(nil)
	if err != nil {
		t.Fatalf("Complete racing a re-upload of the same bytes: %v", err)
	}
	if got := get(t, e.alice, bucket, "same"); got != big("c")+"tail" {
		t.Fatalf("object of %d bytes", len(got))
	}

	// Racing for real: every Complete either gives the object of the ETag
	// it listed or answers InvalidPart.
	for round := range 30 {
		key := fmt.Sprint("r", round)
		id := create(key)
		bodies := map[string]string{}
		first := uploadPart(key, id, 1, fmt.Sprint("first ", round))
		if first == nil {
			t.FailNow()
		}
		bodies[aws.ToString(first.ETag)] = fmt.Sprint("first ", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		wg.Go(func() {
			for i := range 4 {
				body := fmt.Sprint("again ", round, " ", i)
				out, err := e.alice.UploadPart(ctx, &s3.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key),
					UploadId: id, PartNumber: aws.Int32(1), Body: strings.NewReader(body)})
				if err != nil {
					if code(err) != "NoSuchUpload" { // completed meanwhile
						t.Errorf("round %d: re-upload: %v", round, err)
					}
					return
				}
				mu.Lock()
				bodies[aws.ToString(out.ETag)] = body
				mu.Unlock()
			}
		})
		err := complete(key, id, first.ETag)
		wg.Wait()
		switch code(err) {
		case "":
			if got := get(t, e.alice, bucket, key); got != bodies[aws.ToString(first.ETag)] {
				t.Fatalf("round %d: completed object %q, want the listed part's %q", round, got, bodies[aws.ToString(first.ETag)])
			}
		case "InvalidPart":
			if _, err := e.alice.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket),
				Key: aws.String(key), UploadId: id}); err != nil {
				t.Fatalf("round %d: abort: %v", round, err)
			}
		default:
			t.Fatalf("round %d: Complete racing a re-upload: %v, want success or InvalidPart", round, err)
		}
	}
	noTempLeft(t, e)
}
