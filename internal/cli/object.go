package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/client"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/spf13/cobra"
)

// Client-side error codes of `basalt object`.
const (
	// CodeInvalidURI: not s3://BUCKET/KEY.
	CodeInvalidURI = "InvalidURI"
	// CodePathOutsideBuckets: a PATH is not a file inside a bucket
	// directory (nothing was sent to the server).
	CodePathOutsideBuckets = "PathOutsideBuckets"
	// CodeBucketsDirNotFound: the buckets directory does not exist on
	// this machine.
	CodeBucketsDirNotFound = "BucketsDirNotFound"
	// CodeObjectsDamaged: verify found objects that do not match their
	// records.
	CodeObjectsDamaged = "ObjectsDamaged"
)

// objectBatch is how many objects one export or unexport request carries.
const objectBatch = 100

func objectCmd(g *globals) *cobra.Command {
	cmd := group("object", "direct access to the files of S3 objects: path, export, unexport, verify")

	path := &cobra.Command{
		Use:   "path s3://BUCKET/KEY",
		Short: "print the path of the file holding an object's bytes",
		Long: "Prints the absolute path (as the server sees the store) of the file that holds, or would hold, " +
			"BUCKET/KEY. With -o json: {bucket, key, path, exists, exported, modified}.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bucket, key, err := parseS3URI(args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			p, err := c.ObjectPath(ctx(), bucket, key)
			if err != nil {
				return err
			}
			return g.emit(p, func(w *tabwriter.Writer) { fmt.Fprintln(w, p.Path) })
		},
	}

	var root string
	var recursive bool
	pathsCmd := func(use, short, long, verb string, ownLinks bool, run func(c *client.Client, objs []api.ObjectRef) ([]api.ObjectResult, error)) *cobra.Command {
		cmd := &cobra.Command{
			Use: use, Short: short, Long: long, Args: minArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.client()
				if err != nil {
					return err
				}
				objs, err := mapPaths(c, root, args, recursive, ownLinks)
				if err != nil {
					return err
				}
				var all []api.ObjectResult
				var first *api.ErrorDetail
				failed, total := 0, len(objs)
				answer := func() error {
					return g.emit(all, func(w *tabwriter.Writer) {
						for _, r := range all {
							if r.Error == nil {
								fmt.Fprintf(w, "%s\t%s/%s\t%s\t%d\n", verb, r.Bucket, r.Key, r.ETag, *r.Size)
							}
						}
					})
				}
				for len(objs) > 0 {
					n := min(len(objs), objectBatch)
					res, err := run(c, objs[:n])
					if err != nil {
						if len(all) == 0 {
							return err
						}
						// Earlier batches were carried out: their results
						// stay the answer (a script must learn which
						// objects were done), the error says where it
						// stopped.
						if err := answer(); err != nil {
							return err
						}
						g.stdout = io.Discard
						fmt.Fprintf(g.stderr, "%s %d of %d objects before this error; the rest were not sent\n", verb, len(all), total)
						return err
					}
					objs = objs[n:]
					for _, r := range res {
						if r.Error == nil {
							continue
						}
						failed++
						if first == nil {
							first = r.Error
						}
						if total > 1 { // one object: its error is the command's
							msg := r.Error.Message
							if !strings.Contains(msg, r.Bucket+"/"+r.Key) {
								msg = r.Bucket + "/" + r.Key + ": " + msg
							}
							fmt.Fprintf(g.stderr, "error: %s (%s)\n", msg, r.Error.Code)
						}
					}
					all = append(all, res...)
				}
				err = answer()
				if err != nil || failed == 0 {
					return err
				}
				// The list printed is the command's answer, errors
				// included: the summary goes to stderr only.
				g.stdout = io.Discard
				msg := first.Message
				if total > 1 {
					msg = fmt.Sprintf("%d of %d objects failed (the first: %s)", failed, total, first.Message)
				}
				return &errs.Error{Kind: errs.KindInvalid, Code: first.Code, Message: msg}
			},
		}
		cmd.Flags().StringVar(&root, "root", "", "the buckets directory as this machine sees it (default: the server's, from GET /v1/objects/root)")
		cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "a directory PATH stands for every regular file below it")
		return cmd
	}
	export := pathsCmd("export PATH...", "make files written directly into a bucket directory S3 objects",
		"Each PATH is a file under the buckets directory (STORE/buckets/BUCKET/KEY), absolute or relative, "+
			"symbolic links resolved, in a bucket the caller owns. The server computes its MD5 (the ETag) and records "+
			"it with the file's size, mtime and inode: S3 serves it from then on. Exporting an object again accepts its "+
			"current content. Prints one line per object (bucket/key, ETag, size), or with -o json a list of "+
			"{bucket, key, path, etag, size, mtime} and {bucket, key, error}; exits 1 if any failed.",
		"exported", false, func(c *client.Client, objs []api.ObjectRef) ([]api.ObjectResult, error) {
			return c.ExportObjects(ctx(), objs)
		})
	unexport := pathsCmd("unexport PATH...", "remove the S3 records of files: the files stay, S3 no longer sees them",
		"PATH as for export, except that a symbolic link in a bucket stands for its own key, not its target's (a "+
			"link that replaced an exported file is unexported by its name). Prints one line per object (bucket/key "+
			"and the ETag and size its record had), or with -o json a list as for export; exits 1 if any failed.",
		"unexported", true, func(c *client.Client, objs []api.ObjectRef) ([]api.ObjectResult, error) {
			return c.UnexportObjects(ctx(), objs)
		})

	var content, all bool
	verify := &cobra.Command{
		Use:   "verify BUCKET [--content] [--all]",
		Short: "report the objects whose files were changed behind S3",
		Long: "Walks BUCKET and reports every object whose file no longer matches its record: modified (size, mtime " +
			"or inode), with --content also content (the bytes no longer hash to the ETag), missing (a sidecar " +
			"record without its file) and unreadable; old versions are checked too and shown as KEY (version ID). " +
			"--all also lists the files that are not objects (unexported; " +
			"not counted as damage). Prints a table, or with -o json a list of {key, problem, detail}; exits 1 " +
			"(code ObjectsDamaged) if any object is damaged.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bucket := strings.TrimSuffix(strings.TrimPrefix(args[0], "s3://"), "/")
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := c.VerifyObjects(ctx(), bucket, content, all)
			if err != nil {
				return err
			}
			err = g.emit(r.Problems, func(w *tabwriter.Writer) {
				if len(r.Problems) > 0 {
					fmt.Fprintln(w, "KEY\tPROBLEM\tDETAIL")
				}
				for _, p := range r.Problems {
					key := p.Key
					if p.VersionID != "" {
						key += " (version " + p.VersionID + ")"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\n", key, p.Problem, p.Detail)
				}
				fmt.Fprintf(w, "bucket %s: %d objects checked%s, %d damaged, %d files not exported\n", r.Bucket, r.Objects,
					map[bool]string{true: " (content re-hashed)", false: ""}[content], r.Damaged, r.Unexported)
			})
			if err != nil || r.Damaged == 0 {
				return err
			}
			g.stdout = io.Discard // the list printed is the answer; the summary goes to stderr
			return &errs.Error{Kind: errs.KindConflict, Code: CodeObjectsDamaged, Message: fmt.Sprintf(
				"bucket %s: %d of %d objects do not match their records and are not served; export again what was "+
					"changed on purpose (basalt object export), restore the rest", r.Bucket, r.Damaged, r.Objects)}
		},
	}
	verify.Flags().BoolVar(&content, "content", false, "also re-read every object and compare its MD5 with the ETag")
	verify.Flags().BoolVar(&all, "all", false, "also list the files that are not objects")

	cmd.AddCommand(path, export, unexport, verify)
	return cmd
}

// parseS3URI splits s3://BUCKET/KEY.
func parseS3URI(uri string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(uri, "s3://")
	bucket, key, _ = strings.Cut(rest, "/")
	if !ok || bucket == "" || key == "" {
		return "", "", errs.Invalid(CodeInvalidURI, "%q is not an object URI: expected s3://BUCKET/KEY", uri)
	}
	return bucket, key, nil
}

// mapPaths maps file paths to bucket/key pairs: each path, symbolic links
// resolved, must lie inside a bucket directory below root (the server's
// buckets directory unless given). With ownLinks (unexport), a path that
// is itself a symbolic link in a bucket stands for its own key — a link
// that replaced an exported file is unexported by its name — and its
// target only when it lies elsewhere. Any path that maps to no bucket
// fails the whole command before anything is sent. With recursive, a
// directory stands for the regular files below it (and, with ownLinks,
// the symbolic links).
func mapPaths(c *client.Client, root string, paths []string, recursive, ownLinks bool) ([]api.ObjectRef, error) {
	if root == "" {
		r, err := c.ObjectsRoot(ctx())
		if err != nil {
			return nil, err
		}
		root = r.Root
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, errs.Invalid(CodeBucketsDirNotFound, "the buckets directory %s is not on this machine (%v): "+
			"run this on a machine that mounts the store, or pass --root DIR", root, err)
	}
	if realRoot, err = filepath.Abs(realRoot); err != nil {
		return nil, err
	}
	var out []api.ObjectRef
	// locate maps the resolved path p of argument arg; a directory of a
	// bucket (dir) may be the bucket's own.
	locate := func(arg, p string, dir bool) (api.ObjectRef, error) {
		rel, err := filepath.Rel(realRoot, p)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return api.ObjectRef{}, errs.Invalid(CodePathOutsideBuckets, "%s (%s) is not inside the buckets directory %s: "+
				"only files in a bucket directory can be objects", arg, p, realRoot)
		}
		bucket, key, _ := strings.Cut(filepath.ToSlash(rel), "/")
		if key == "" && !dir {
			return api.ObjectRef{}, errs.Invalid(CodePathOutsideBuckets, "%s is the directory of bucket %s, not a file in it "+
				"(use --recursive for every file in it)", arg, bucket)
		}
		return api.ObjectRef{Bucket: bucket, Key: key}, nil
	}
	add := func(arg, p string) error {
		ref, err := locate(arg, p, false)
		if err == nil {
			out = append(out, ref)
		}
		return err
	}
	for _, arg := range paths {
		p, err := resolve(arg)
		if err != nil {
			return nil, errs.Invalid(CodePathOutsideBuckets, "%s: %v", arg, err)
		}
		fi, err := os.Stat(p)
		if !recursive || err != nil || !fi.IsDir() {
			if ownLinks {
				if own, err := resolveDir(arg); err == nil {
					if ref, err := locate(arg, own, false); err == nil {
						out = append(out, ref)
						continue
					}
				}
			}
			if err := add(arg, p); err != nil {
				return nil, err
			}
			continue
		}
		if _, err := locate(arg, p, true); err != nil {
			return nil, err
		}
		err = filepath.WalkDir(p, func(f string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), ".basalt") && f != p {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			if d.Type().IsRegular() {
				return add(f, f)
			}
			if ownLinks && d.Type()&fs.ModeSymlink != 0 {
				return add(f, f) // the link's own key (WalkDir does not follow it)
			}
			return nil
		})
		if err != nil {
			if _, ok := errs.As(err); ok {
				return nil, err
			}
			return nil, errs.Invalid(CodePathOutsideBuckets, "%s: %v", arg, err)
		}
	}
	if len(out) == 0 {
		return nil, errs.Invalid(CodePathOutsideBuckets, "no files to send")
	}
	return out, nil
}

// resolveDir is resolve for p's directory, p's last element kept as it is.
func resolveDir(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	dir, err := resolve(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(abs)), nil
}

// resolve makes p absolute with its symbolic links resolved; the part of
// the path that does not exist (a file already removed, for unexport) is
// kept as given.
func resolve(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var missing []string
	cur := abs
	for {
		r, err := filepath.EvalSymlinks(cur)
		if err == nil {
			return filepath.Join(append([]string{r}, missing...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return abs, nil
		}
		missing = append([]string{filepath.Base(cur)}, missing...)
		cur = parent
	}
}
