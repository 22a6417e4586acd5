// Command basalt is the one basalt binary: `basalt server` runs a node; every
// other subcommand is the command-line client of the control API.
package main

import (
	"os"

	"github.com/basalt-storage/basalt/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
