package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/jsonstrict"
	"github.com/basalt-storage/basalt/internal/volume"
)

// maxBody bounds request bodies; every request of this API is tiny.
const maxBody = 1 << 20

// decode parses a JSON request body strictly (jsonstrict): one object, no
// unknown or repeated fields, no field named in another case, nothing
// after it. It is the single parser behind every request type and a fuzz
// target (decode_fuzz_test.go).
func decode(body []byte, v any) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return errs.Invalid(errs.CodeMalformedJSON, "request body is empty; expected a JSON object")
	}
	// encoding/json reads null into a struct as nothing at all: a body of
	// null passed for {} (POST /v1/nodes/join-token answered it with a
	// token). Other values it refuses with an error naming the Go type.
	if trimmed[0] != '{' {
		return errs.Invalid(errs.CodeMalformedJSON, "request body must be a JSON object, not %s", jsonKind(trimmed[0]))
	}
	err := jsonstrict.Decode(body, v)
	if err == nil {
		return nil
	}
	if e, ok := errs.As(err); ok {
		return e
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var key *jsonstrict.KeyError
	switch {
	case errors.As(err, &key):
		return errs.Invalid(errs.CodeMalformedJSON, "%v", key)
	case errors.Is(err, jsonstrict.ErrTrailing):
		return errs.Invalid(errs.CodeMalformedJSON, "malformed JSON: unexpected data after the object")
	case errors.As(err, &syn):
		return errs.Invalid(errs.CodeMalformedJSON, "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		return errs.Invalid(errs.CodeMalformedJSON, "field %q must be %s, not %s", typ.Field, typ.Type, typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errs.Invalid(errs.CodeMalformedJSON, "malformed JSON: unexpected end of input")
	}
	return errs.Invalid(errs.CodeMalformedJSON, "malformed JSON: %v", err)
}

// jsonKind names the JSON value that starts with c, for messages.
func jsonKind(c byte) string {
	switch {
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 'n':
		return "null"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == '-' || c >= '0' && c <= '9':
		return "a number"
	}
	return "something that is not JSON"
}

// ParseCreateVolume decodes and validates POST /v1/volumes.
func ParseCreateVolume(body []byte) (volume.CreateVolume, error) {
	var r CreateVolumeRequest
	if err := decode(body, &r); err != nil {
		return volume.CreateVolume{}, err
	}
	if r.Size == 0 && r.FromSnapshot == "" && r.FromObject == "" {
		return volume.CreateVolume{}, errs.Invalid(errs.CodeInvalidSize, "size is required (e.g. \"10GiB\") unless from_snapshot or from_object is given")
	}
	return volume.CreateVolume{Name: r.Name, SizeBytes: int64(r.Size), Type: r.Type,
		FromSnapshot: r.FromSnapshot, FromObject: r.FromObject, Multiattach: r.Multiattach, ClientToken: r.ClientToken}, nil
}

// ParseExportSnapshot decodes POST /v1/snapshots/{id}/export.
func ParseExportSnapshot(body []byte) (ExportSnapshotRequest, error) {
	var r ExportSnapshotRequest
	if err := decode(body, &r); err != nil {
		return r, err
	}
	if r.To == "" {
		return r, errs.Invalid(errs.CodeInvalidRequest, "to is required: the object to write, s3://BUCKET/KEY")
	}
	return r, nil
}

// ParseExtendVolume decodes POST /v1/volumes/{id}/extend.
func ParseExtendVolume(body []byte) (int64, error) {
	var r ExtendVolumeRequest
	if err := decode(body, &r); err != nil {
		return 0, err
	}
	if r.Size == 0 {
		return 0, errs.Invalid(errs.CodeInvalidSize, "size is required")
	}
	return int64(r.Size), nil
}

// ParseCreateSnapshot decodes POST /v1/snapshots.
func ParseCreateSnapshot(body []byte) (CreateSnapshotRequest, error) {
	var r CreateSnapshotRequest
	if err := decode(body, &r); err != nil {
		return r, err
	}
	if r.Volume == "" {
		return r, errs.Invalid(errs.CodeInvalidRequest, "volume is required")
	}
	return r, nil
}

// ParseCreateVolumeType decodes POST /v1/types. The stack itself is
// validated by the volume service, which builds it.
func ParseCreateVolumeType(body []byte) (CreateVolumeTypeRequest, error) {
	var r CreateVolumeTypeRequest
	if err := decode(body, &r); err != nil {
		return r, err
	}
	if r.Name == "" {
		return r, errs.Invalid(errs.CodeInvalidName, "name is required")
	}
	if len(r.Stack) == 0 || string(r.Stack) == "null" {
		return r, errs.Invalid(errs.CodeInvalidStack, "stack is required")
	}
	return r, nil
}

// ParseCreateUser decodes POST /v1/users.
func ParseCreateUser(body []byte) (CreateUserRequest, error) {
	var r CreateUserRequest
	if err := decode(body, &r); err != nil {
		return r, err
	}
	if r.Name == "" {
		return r, errs.Invalid(errs.CodeInvalidName, "name is required")
	}
	return r, nil
}

func readBody(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBody+1))
	if err != nil {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "reading request body: %v", err)
	}
	if len(b) > maxBody {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "request body exceeds %d bytes", maxBody)
	}
	return b, nil
}

// ParseAttach decodes POST /v1/attachments.
func ParseAttach(body []byte) (AttachRequest, error) {
	var r AttachRequest
	if err := decode(body, &r); err != nil {
		return r, err
	}
	if r.Volume == "" || r.Host == "" {
		return r, errs.Invalid(errs.CodeInvalidRequest, "volume and host are required")
	}
	return r, nil
}
