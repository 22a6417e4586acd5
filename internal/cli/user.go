package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/spf13/cobra"
)

func userCmd(g *globals) *cobra.Command {
	cmd := group("user", "manage users (admin)")
	var uid, gid int
	var out string
	var admin bool
	create := &cobra.Command{
		Use:   "create NAME --out DIR",
		Short: "create a user and write its identity directory",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usageErr("--out DIR is required: the user's identity directory")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			// The answer holds the only copy of the user's private key
			// and S3 secret (the server keeps neither), so --out is made
			// ready first: found unusable after the create, the identity
			// was lost and the name taken, and another identity there
			// was overwritten.
			discard, err := prepareIdentityDir(out)
			if err != nil {
				return err
			}
			req := api.CreateUserRequest{Name: args[0], Admin: admin}
			if cmd.Flags().Changed("uid") {
				req.UID = &uid
			}
			if cmd.Flags().Changed("gid") {
				req.GID = &gid
			}
			r, err := c.CreateUser(ctx(), req)
			if err != nil {
				discard()
				return err
			}
			if err := identityOf(r.Identity).Write(out); err != nil {
				return errs.New(errs.KindInternal, CodeIdentity, "user %s was created but its identity could not be written: %v", args[0], err)
			}
			return g.emit(r.User, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "created user %s; identity written to %s\n", r.User.Name, out)
			})
		},
	}
	create.Flags().IntVar(&uid, "uid", 0, "cluster uid the user maps to (S3 file ownership)")
	create.Flags().IntVar(&gid, "gid", 0, "cluster gid the user maps to")
	create.Flags().StringVar(&out, "out", "", "directory to write the identity to (ca.pem cert.pem key.pem s3.env)")
	create.Flags().BoolVar(&admin, "admin", false, "make the user an administrator")

	var credOut string
	credentials := &cobra.Command{
		Use:   "credentials NAME --out DIR",
		Short: "issue new credentials for a user (certificate and S3 keys) and revoke the earlier ones",
		Long: `Issue a new identity for an existing user — a client certificate and a new S3 key
pair — written to DIR, and revoke every earlier certificate and the earlier S3 keys of
the user, on every node (for admin: the nodes' local admin identities too; each node
writes itself a new one at its next start). The user keeps its volumes, snapshots and
buckets. DIR must not hold an identity already: give a new directory, then replace the
old one with it.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if credOut == "" {
				return usageErr("--out DIR is required: the directory the new identity is written to")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			// As for create: the answer holds the only copy of the new
			// key and secret, and the old ones are revoked by then.
			discard, err := prepareIdentityDir(credOut)
			if err != nil {
				return err
			}
			r, err := c.UserCredentials(ctx(), args[0])
			if err != nil {
				discard()
				return err
			}
			if err := identityOf(r.Identity).Write(credOut); err != nil {
				return errs.New(errs.KindInternal, CodeIdentity,
					"new credentials for user %s were issued (the earlier ones are revoked) but could not be written: %v; issue new credentials again", args[0], err)
			}
			return g.emit(r.User, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "issued new credentials for user %s; identity written to %s; its earlier certificates and S3 keys are revoked\n", r.User.Name, credOut)
			})
		},
	}
	credentials.Flags().StringVar(&credOut, "out", "", "directory to write the new identity to (must not hold an identity)")

	list := &cobra.Command{
		Use: "list", Short: "list users", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			us, err := c.Users(ctx())
			if err != nil {
				return err
			}
			return g.emit(us, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "NAME\tADMIN\tUID\tGID\tACCESS KEY\tCREATED")
				for _, u := range us {
					fmt.Fprintf(w, "%s\t%v\t%s\t%s\t%s\t%s\n", u.Name, u.Admin, optInt(u.UID), optInt(u.GID), u.AccessKeyID, u.CreatedAt.Format("2006-01-02 15:04:05"))
				}
			})
		},
	}
	show := &cobra.Command{
		Use: "show NAME", Short: "show a user", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			u, err := c.User(ctx(), args[0])
			if err != nil {
				return err
			}
			return g.emit(u, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "name:\t%s\nadmin:\t%v\nuid:\t%s\ngid:\t%s\naccess key:\t%s\ncreated:\t%s\n",
					u.Name, u.Admin, optInt(u.UID), optInt(u.GID), u.AccessKeyID, u.CreatedAt.Format("2006-01-02 15:04:05"))
				switch {
				case u.LegacyCertificates:
					fmt.Fprintf(w, "certificates:\tany issued for this user before the upgrade (legacy record; issue new credentials to list them)\n")
				case len(u.Certificates) == 0:
					fmt.Fprintf(w, "certificates:\tnone\n")
				default:
					fmt.Fprintf(w, "certificates:\n")
				}
				for _, c := range u.Certificates {
					fmt.Fprintf(w, "  %s\t%s\texpires %s\n", c.Serial, c.IssuedFor, c.NotAfter.Format("2006-01-02 15:04:05"))
				}
			})
		},
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "delete a user, revoking its certificates and keys and detaching its attachments", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteUser(ctx(), args[0]); err != nil {
				return err
			}
			return g.emit(map[string]string{"deleted": args[0]}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "deleted user %s\n", args[0])
			})
		},
	}
	cmd.AddCommand(create, credentials, list, show, del)
	return cmd
}

// identityOf is the identity directory an answer carries.
func identityOf(r api.Identity) *pki.Identity {
	return &pki.Identity{CAPEM: []byte(r.CAPEM), CertPEM: []byte(r.CertPEM),
		KeyPEM: []byte(r.KeyPEM), AccessKeyID: r.AccessKeyID, SecretAccessKey: r.SecretAccessKey,
		S3Endpoint: r.S3Endpoint, S3Region: r.S3Region, S3CABundle: r.S3CABundle}
}

// identityFiles are the files pki.Identity.Write writes.
var identityFiles = []string{"ca.pem", "cert.pem", "key.pem", "s3.env", "ca-cert.pem", "client-cert.pem", "client-key.pem"}

// prepareIdentityDir makes dir ready to receive a new identity: a
// writable directory (created 0700 if missing) that holds no identity
// already. discard removes the directory again if it made it, for a
// create the server refused.
func prepareIdentityDir(dir string) (discard func(), err error) {
	discard = func() {}
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, errs.Invalid(CodeIdentity, "--out %s: %v", dir, err)
		}
		discard = func() { os.Remove(dir) }
	}
	fail := func(format string, a ...any) (func(), error) {
		discard()
		return nil, errs.Invalid(CodeIdentity, "--out "+format, a...)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fail("%s: %v", dir, err)
	}
	if !fi.IsDir() {
		return fail("%s is not a directory", dir)
	}
	for _, f := range identityFiles {
		if _, err := os.Lstat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			return fail("%s already holds an identity (%s); give each user a directory of its own", dir, f)
		}
	}
	probe, err := os.CreateTemp(dir, ".basalt-probe-*")
	if err != nil {
		return fail("%s is not writable: %v", dir, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return discard, nil
}

func optInt(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}
