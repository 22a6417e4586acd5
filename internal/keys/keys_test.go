package keys

import (
	"bytes"
	"errors"
	"testing"
)

func TestWrapUnwrap(t *testing.T) {
	w, err := New(Generate())
	if err != nil {
		t.Fatal(err)
	}
	dek := bytes.Repeat([]byte{0x5a}, 64)
	wrapped, err := w.Wrap(dek)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(wrapped, dek[:16]) {
		t.Fatal("wrapped key contains the plaintext key")
	}
	got, err := w.Unwrap(wrapped)
	if err != nil || !bytes.Equal(got, dek) {
		t.Fatalf("unwrap: %v", err)
	}
	other, _ := New(Generate())
	if _, err := other.Unwrap(wrapped); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("another cluster's key unwrapped it: %v", err)
	}
	wrapped[len(wrapped)-1] ^= 1
	if _, err := w.Unwrap(wrapped); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("an altered wrapped key unwrapped: %v", err)
	}
	for _, bad := range [][]byte{nil, {1}, {2, 3, 4}} {
		if _, err := w.Unwrap(bad); !errors.Is(err, ErrWrongKey) {
			t.Fatalf("Unwrap(%v): %v", bad, err)
		}
	}
	if _, err := New([]byte("short")); err == nil {
		t.Fatal("short cluster key accepted")
	}
}
