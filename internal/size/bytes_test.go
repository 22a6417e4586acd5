package size

import "testing"

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0:               "0 bytes",
		512:             "512 bytes",
		1 << 10:         "1 KiB (1024 bytes)",
		1610612736:      "1.5 GiB (1610612736 bytes)",
		21474836480:     "20 GiB (21474836480 bytes)",
		-(1 << 30):      "-1 GiB (-1073741824 bytes)",
		109951162777600: "100 TiB (109951162777600 bytes)",
	} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
