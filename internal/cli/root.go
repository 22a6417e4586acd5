// Package cli is the basalt command line: `basalt server` runs a node, every
// other command is a client of the control API. The command tree and its
// flags are the stable contract of brief §3.
//
// Configuration has one source of truth per setting, resolved in this order:
// command-line flag, environment variable BASALT_<FLAG> (dashes become
// underscores), the config file given by --config (server only), default.
// Every server flag is read so; of a client command's flags only the
// globals (--endpoint, --identity, --output) come from the environment
// (bindEnv says why). A server setting given empty, in the environment or
// the file, is its default.
//
// Errors print "error: MESSAGE (CODE)" on stderr and exit 1; with -o json
// (or BASALT_OUTPUT=json) the error is also printed on stdout as
// {"error":{"code","message"}}, unless the command printed its answer
// before failing (status of an unhealthy node, object export, unexport and
// verify): stdout then holds that answer alone.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
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

// defaultEndpoint is --endpoint's default: the API of a node on this
// machine with the default --api.
const defaultEndpoint = "https://127.0.0.1:8443"

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
	bound := false // whether PersistentPreRunE read the environment
	root := &cobra.Command{
		Use:           "basalt",
		Short:         "basalt: block volumes, S3 objects and HA metadata over a parallel file system",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			// Given empty on the line (an unset variable), --identity
			// would fall back to ./basalt-data/identities/admin: a
			// command meant for a user would run as the administrator.
			// (BASALT_IDENTITY= stays "not set", as the environment is
			// cleared so.)
			if f := cmd.Flags().Lookup("identity"); f != nil && f.Changed && f.Value.String() == "" &&
				cmd.Annotations[envAnnotation] != envEveryFlag {
				return usageErr("--identity was given an empty value (an unset variable?): give it one, or leave the flag out")
			}
			err := bindEnv(cmd)
			bound = true
			if err != nil {
				return err
			}
			if g.output != "table" && g.output != "json" {
				return usageErr("-o (or BASALT_OUTPUT) must be table or json, not %q", g.output)
			}
			return checkEmptyFlags(cmd)
		},
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.endpoint, "endpoint", defaultEndpoint, "control API URL (env BASALT_ENDPOINT)")
	pf.StringVar(&g.identity, "identity", "", "identity directory: ca.pem, cert.pem, key.pem (env BASALT_IDENTITY; default ./basalt-data/identities/admin when present)")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json (env BASALT_OUTPUT)")
	root.AddCommand(serverCmd(g), statusCmd(g), userCmd(g), volumeCmd(g), snapshotCmd(g), typeCmd(g),
		attachCmd(g), detachCmd(g), attachmentCmd(g), metaCmd(g), versionCmd(g))
	root.AddCommand(objectCmd(g), nodeCmd(g))
	root.SetHelpCommand(helpCmd())
	err := root.Execute()
	if err == nil {
		return 0
	}
	if !bound {
		// Parsing the line failed (an unknown flag, a missing argument)
		// before -o was read or the environment bound: BASALT_OUTPUT=json
		// must get the error as JSON as -o json does.
		g.output = earlyOutput(args)
	}
	g.printError(err)
	return 1
}

// earlyOutput is the output format args ask for (the last -o, as for
// pflag), else BASALT_OUTPUT's, for errors raised before flag parsing
// completed.
func earlyOutput(args []string) string {
	out, given := "", false
	for i, a := range args {
		if a == "--" {
			break
		}
		for _, p := range []string{"--output=", "-o=", "-o"} {
			if v, ok := strings.CutPrefix(a, p); ok && v != "" {
				out, given = v, true
				break
			}
		}
		if (a == "-o" || a == "--output") && i+1 < len(args) {
			out, given = args[i+1], true
		}
	}
	if !given {
		out = os.Getenv("BASALT_OUTPUT")
	}
	return out
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

// Checks of positional arguments, instead of cobra's: those name neither
// the command nor what it takes ("accepts 1 arg(s), received 0"), and
// call an argument given to a command that takes none an "unknown
// command". What a command takes is read from its Use line.

// noArgs is cobra.NoArgs.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErr("%s takes no arguments, got %s (usage: %s)", cmd.CommandPath(), quoteArgs(args), cmd.UseLine())
	}
	return nil
}

// exactArgs is cobra.ExactArgs.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < n:
			return usageErr("%s needs %s (usage: %s)", cmd.CommandPath(), argNames(cmd), cmd.UseLine())
		case len(args) > n:
			return usageErr("%s takes only %s; got %d arguments: %s (usage: %s)", cmd.CommandPath(), argNames(cmd),
				len(args), quoteArgs(args), cmd.UseLine())
		}
		return checkEmptyArgs(cmd, args)
	}
}

// checkEmptyArgs refuses an empty argument, as checkEmptyFlags refuses
// an empty flag value: mostly a shell variable that was not set
// (`basalt volume delete "$VOL"`). Sent as it is, it made a path no route
// takes (GET /v1/volumes/), and the command failed with `route "GET
// /v1/volumes/" not found (NotFound)`, naming neither the argument nor the
// command line as the mistake; `snapshot create ""` and `attach ""` were
// refused by the server only after a round trip, as a request missing its
// volume.
func checkEmptyArgs(cmd *cobra.Command, args []string) error {
	names := strings.Fields(argNames(cmd))
	for i, a := range args {
		if a != "" {
			continue
		}
		name := "argument"
		if i < len(names) {
			name = names[i]
		}
		return usageErr("%s was given an empty %s (an unset variable?): give it one (usage: %s)", cmd.CommandPath(), name, cmd.UseLine())
	}
	return nil
}

// minArgs is cobra.MinimumNArgs.
func minArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usageErr("%s needs %s (usage: %s)", cmd.CommandPath(), argNames(cmd), cmd.UseLine())
		}
		return nil
	}
}

// argNames are the arguments cmd's Use line names: the words after the
// command's name, up to the first flag or optional part.
func argNames(cmd *cobra.Command) string {
	var names []string
	for _, w := range strings.Fields(cmd.Use)[1:] {
		if strings.HasPrefix(w, "-") || strings.HasPrefix(w, "[") {
			break
		}
		names = append(names, w)
	}
	return strings.Join(names, " ")
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = fmt.Sprintf("%q", a)
	}
	return strings.Join(q, " ")
}

// Client-side error codes (the server's are in package errs).
const (
	CodeUsage    = "UsageError"
	CodeIdentity = "IdentityError"
	// CodeInterrupted: Ctrl-C stopped a --wait (not the job).
	CodeInterrupted = "Interrupted"
	// CodeOutput: the answer could not be written to stdout.
	CodeOutput = "OutputError"
)

func usageErr(format string, a ...any) error {
	return errs.Invalid(CodeUsage, format, a...)
}

// printError renders err for humans (stderr) and, with -o json, for scripts.
func (g *globals) printError(err error) {
	e, ok := errs.As(err)
	if !ok {
		// Anything untyped comes from the command line itself (cobra).
		e = &errs.Error{Code: CodeUsage, Message: oneLine(err.Error())}
	}
	fmt.Fprintf(g.stderr, "error: %s (%s)\n", e.Message, e.Code)
	if g.output == "json" {
		json.NewEncoder(g.stdout).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: e.Code, Message: e.Message}})
	}
}

// oneLine folds cobra's multi-line unknown-command message ("...\n\nDid
// you mean this?\n\tvolume\n") into one line, so that the error, code
// included, stays one line on stderr.
func oneLine(msg string) string {
	const suggest = "\n\nDid you mean this?\n"
	msg = strings.TrimSpace(msg)
	if i := strings.Index(msg, suggest); i >= 0 {
		msg = msg[:i] + "; did you mean " + strings.Join(strings.Fields(msg[i+len(suggest):]), " or ") + "?"
	}
	return strings.Join(strings.Fields(msg), " ")
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
		key := "BASALT_" + envName(f.Name)
		if v, ok := os.LookupEnv(key); ok {
			if v == "" && cmd.Annotations[envAnnotation] == envEveryFlag {
				// The server's: empty means the default, whatever the
				// flag's type, as an empty key of its config file does
				// (BASALT_API= once listened on every interface;
				// BASALT_S3_TLS= refused to start the node).
				return
			}
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

// envName is the part of BASALT_<FLAG> that names flag: upper case,
// dashes as underscores.
func envName(flag string) string { return strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }

// checkEmptyFlags refuses a client command's flag given an empty value.
// Mostly it is a shell variable that was not set (--volume "$VOL"), and
// read as the flag left out it changes the command's meaning: a list
// filter is dropped (the unfiltered list answers), --from-snapshot ""
// creates an empty volume instead of a clone. The server's flags are
// exempt: an empty value in its environment or file means the default.
// So are the flags whose commands refuse an empty value with a code of
// their own, which scripts match on (--size "": InvalidSize).
func checkEmptyFlags(cmd *cobra.Command) error {
	if cmd.Annotations[envAnnotation] == envEveryFlag {
		return nil
	}
	var err error
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if err == nil && f.Changed && f.Value.Type() == "string" && f.Value.String() == "" && !ownEmptyCheck[f.Name] {
			err = usageErr("--%s was given an empty value (an unset variable?): give it one, or leave the flag out", f.Name)
		}
	})
	return err
}

// ownEmptyCheck are the flags exempt from checkEmptyFlags: size
// (InvalidSize), to (snapshot export: InvalidRequest), stack (type create:
// InvalidStack).
var ownEmptyCheck = map[string]bool{"size": true, "to": true, "stack": true}

// client builds an API client from the global flags.
func (g *globals) client() (*client.Client, error) {
	if err := checkEndpoint(g.endpoint); err != nil {
		return nil, err
	}
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

// checkEndpoint refuses an --endpoint that is not an https:// URL the
// API's paths can be appended to. The API is HTTPS only: http:// used to
// get the server's plain-text 400 reported as an InternalError, and a URL
// without a scheme a network error ("unsupported protocol scheme", code
// Unreachable), neither saying that the flag was wrong.
func checkEndpoint(ep string) error {
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Opaque != "" || u.User != nil ||
		u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return usageErr("--endpoint (or BASALT_ENDPOINT) %q is not the control API's URL: want https://HOST:PORT", ep)
	}
	return nil
}

// emit prints v as JSON or, for tables, through table. A failure to
// write is an OutputError: untyped it was reported as a UsageError,
// which says nothing was done, while the answer printed is that of a
// command carried out.
func (g *globals) emit(v any, table func(w *tabwriter.Writer)) error {
	var err error
	if g.output == "json" {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(v)
	} else {
		w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		table(w)
		err = w.Flush()
	}
	if err != nil {
		return errs.New(errs.KindInternal, CodeOutput, "writing the answer to stdout: %v (the command itself was carried out; look before repeating it)", err)
	}
	return nil
}

func ctx() context.Context { return context.Background() }

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// -o json: a document, as every command prints.
			return g.emit(map[string]string{"version": version()}, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "basalt", version())
			})
		},
	}
}

// helpCmd is `basalt help [command]`: cobra's, except that an unknown
// topic is a UsageError (exit 1) — cobra's printed the usage and exited 0,
// so `basalt help volum` read as success to a script.
func helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "help about any command",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, _, err := c.Root().Find(args)
			if cmd == nil || err != nil {
				return usageErr("unknown help topic %q: `basalt --help` lists the commands", strings.Join(args, " "))
			}
			return cmd.Help()
		},
	}
}
