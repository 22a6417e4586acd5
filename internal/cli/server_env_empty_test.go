package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// TestEmptyServerEnvAnyType: an empty BASALT_<FLAG> of the server means
// the flag's default whatever its type, as an empty key of the config
// file does. Only string flags did: an empty BASALT_S3_TLS, BASALT_VOTERS,
// BASALT_IMAGE_GRACE or BASALT_OVERCOMMIT (a unit file's `Environment=`
// line left blank) refused to start the node with a parse error, while
// `s3-tls:` in the file was the default.
func TestEmptyServerEnvAnyType(t *testing.T) {
	names := []string{"s3-tls", "voters", "image-grace", "overcommit", "nbd-max-handshakes", "meta-endpoints"}
	for _, name := range names {
		t.Setenv("BASALT_"+envName(name), "")
	}
	cmd := serverCmd(&globals{})
	if err := bindEnv(cmd); err != nil {
		t.Fatalf("empty server settings in the environment: %v", err)
	}
	for _, name := range names {
		if f := cmd.Flags().Lookup(name); f.Changed || f.Value.String() != f.DefValue {
			t.Errorf("--%s after an empty BASALT_%s: %q (changed %v), want its default %q", name, envName(name), f.Value, f.Changed, f.DefValue)
		}
	}
	// The same keys left empty in the config file: the defaults too.
	file := filepath.Join(t.TempDir(), "basalt.yaml")
	yaml := ""
	for _, name := range names {
		yaml += name + ":\n"
	}
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := serverCmd(&globals{}).Flags()
	if err := applyConfigFile(fs, file); err != nil {
		t.Fatalf("empty keys in the config file: %v", err)
	}
}
