// Package cli is the basalt command line: `basalt server` runs a node, every
// other command is a client of the control API. The command tree and its
// flags are the stable contract of brief §3.
//
// Configuration has one source of truth per setting, resolved in this order:
// command-line flag, environment variable BASALT_<FLAG> (dashes become
// underscores), the config file given by --config (server only), default.
//
// Errors print "error: MESSAGE (CODE)" on stderr and exit 1; with -o json the
// error is also printed on stdout as {"error":{"code","message"}}, unless the
// command printed its answer before failing (status of an unhealthy node,
// object export, unexport and verify): stdout then holds that answer alone.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/basalt-storage/basalt/internal/api"
	"github.com/basalt-storage/basalt/internal/client"
	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// globals are the flags every client command shares.
type globals struct {
	endpoint string
	identity string
	output   string
	stdout   io.Writer
	stderr   io.Writer
}

// Main runs the CLI with args and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "basalt",
		Short:         "basalt: block volumes, S3 objects and HA metadata over a parallel file system",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd); err != nil {
				return err
			}
			if g.output != "table" && g.output != "json" {
				return usageErr("-o must be table or json, not %q", g.output)
			}
			return nil
		},
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.endpoint, "endpoint", "https://127.0.0.1:8443", "control API URL (env BASALT_ENDPOINT)")
	pf.StringVar(&g.identity, "identity", "", "identity directory: ca.pem, cert.pem, key.pem (env BASALT_IDENTITY; default ./basalt-data/identities/admin when present)")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	root.AddCommand(serverCmd(g), statusCmd(g), userCmd(g), volumeCmd(g), snapshotCmd(g), typeCmd(g),
		attachCmd(g), detachCmd(g), attachmentCmd(g), metaCmd(g), versionCmd(g))
	root.AddCommand(objectCmd(g), nodeCmd(g))
	err := root.Execute()
	if err == nil {
		return 0
	}
	if g.output != "json" && wantsJSON(args) {
		g.output = "json" // parsing failed before -o was read
	}
	g.printError(err)
	return 1
}

// wantsJSON reports whether args ask for JSON output, for errors raised
// before flag parsing completed.
func wantsJSON(args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "-ojson", a == "-o=json", a == "--output=json":
			return true
		case (a == "-o" || a == "--output") && i+1 < len(args) && args[i+1] == "json":
			return true
		}
	}
	return false
}

// group makes a command that only holds subcommands. Unlike cobra's
// default it fails on an unknown subcommand instead of printing help and
// succeeding, so that a typo in a script is an error.
func group(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErr("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
}

// Client-side error codes (the server's are in package errs).
const (
	CodeUsage    = "UsageError"
	CodeIdentity = "IdentityError"
)

func usageErr(format string, a ...any) error {
	return errs.Invalid(CodeUsage, format, a...)
}

// printError renders err for humans (stderr) and, with -o json, for scripts.
func (g *globals) printError(err error) {
	e, ok := errs.As(err)
	if !ok {
		// Anything untyped comes from the command line itself (cobra).
		e = &errs.Error{Code: CodeUsage, Message: err.Error()}
	}
	fmt.Fprintf(g.stderr, "error: %s (%s)\n", e.Message, e.Code)
	if g.output == "json" {
		json.NewEncoder(g.stdout).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: e.Code, Message: e.Message}})
	}
}

// envAnnotation, set to envEveryFlag on a command, makes bindEnv fill every
// flag of that command from the environment: the server's configuration
// (docs/operations.md).
const (
	envAnnotation = "basalt-env"
	envEveryFlag  = "every-flag"
)

// bindEnv fills flags not given on the command line from BASALT_<FLAG>:
// the global ones (--endpoint, --identity, --output) of every command, and
// every flag of a command annotated with envEveryFlag (the server). Other
// client flags are not: a shell that runs a server exports BASALT_NAME, the
// node's name, which must not name every volume created there without
// --name.
func bindEnv(cmd *cobra.Command) error {
	var err error
	set := func(f *pflag.Flag) {
		if f.Changed || err != nil {
			return
		}
		key := "BASALT_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(key); ok {
			if e := f.Value.Set(v); e != nil {
				err = usageErr("%s=%q: %v", key, v, e)
			}
			f.Changed = true
		}
	}
	if cmd.Annotations[envAnnotation] == envEveryFlag {
		cmd.Flags().VisitAll(set)
	}
	cmd.InheritedFlags().VisitAll(set) // the globals: the root's are the only persistent flags
	return err
}

// client builds an API client from the global flags.
func (g *globals) client() (*client.Client, error) {
	dir := g.identity
	if dir == "" {
		def := filepath.Join("basalt-data", "identities", "admin")
		if _, err := os.Stat(filepath.Join(def, "cert.pem")); err == nil {
			dir = def
		} else {
			return nil, errs.Invalid(CodeIdentity, "no identity: pass --identity DIR or set BASALT_IDENTITY (an identity dir holds ca.pem, cert.pem, key.pem)")
		}
	}
	id, err := pki.LoadIdentity(dir)
	if err != nil {
		return nil, errs.Invalid(CodeIdentity, "%v", err)
	}
	tc, err := id.ClientTLS()
	if err != nil {
		return nil, errs.Invalid(CodeIdentity, "identity %s: %v", dir, err)
	}
	return client.New(g.endpoint, tc), nil
}

// emit prints v as JSON or, for tables, through table.
func (g *globals) emit(v any, table func(w *tabwriter.Writer)) error {
	if g.output == "json" {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

func ctx() context.Context { return context.Background() }

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(g.stdout, "basalt", version())
			return nil
		},
	}
}
