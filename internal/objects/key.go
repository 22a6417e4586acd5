package objects

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/versity/versitygw/s3api/utils"
	"github.com/versity/versitygw/s3err"
)

// Key rules (docs/objects.md). An object key names a file below the
// bucket directory, one path component per "/"-separated part, so every
// key must be a clean relative path that maps to exactly one file and
// never leaves the bucket directory. checkKey is called before any path
// is built from a key.
const (
	// maxKeyLen is S3's key limit, in bytes.
	maxKeyLen = 1024
	// maxComponentLen is NAME_MAX on the usual Linux file systems.
	maxComponentLen = 255
	// reservedPrefix starts the names basalt keeps for itself inside a
	// bucket directory (e.g. future version files); no key component may
	// start with it, and listings skip such entries.
	reservedPrefix = ".basalt"
)

// invalidKey is an InvalidArgument error whose message says what is
// wrong with the key.
func invalidKey(format string, args ...any) error {
	return s3err.APIError{
		Code:           "InvalidArgument",
		Description:    "Invalid object key: " + fmt.Sprintf(format, args...),
		HTTPStatusCode: http.StatusBadRequest,
	}
}

// dotSegment is the error for a key with a "." or ".." path component:
// keys are paths inside the bucket, and such a component would leave the
// bucket or make two keys name one file.
func dotSegment(comp string) error {
	if comp == ".." {
		return invalidKey("the key contains a \"..\" segment, which would leave or alias a directory (a key is a path inside the bucket)")
	}
	return invalidKey("the key contains a \".\" segment, which would alias another key (a key is a path inside the bucket)")
}

// checkKey returns nil if key is a valid basalt object key, or an S3
// error (InvalidArgument or KeyTooLongError) that says why not. Writes
// answer that error; reads of such a key answer NoSuchKey (readKey):
// it cannot name an object.
func checkKey(key string) error {
	if key == "" {
		return invalidKey("the key is empty")
	}
	if len(key) > maxKeyLen {
		return s3err.GetKeyTooLongErr(int64(len(key)), maxKeyLen)
	}
	if !utf8.ValidString(key) {
		return invalidKey("the key is not valid UTF-8")
	}
	if i := strings.IndexAny(key, "\uFFFE\uFFFF"); i >= 0 {
		// Not characters XML can carry: every listing would show the key
		// with U+FFFD in their place, a key that is not the object's.
		r, _ := utf8.DecodeRuneInString(key[i:])
		return invalidKey("the key contains the noncharacter %U, which XML listings cannot carry", r)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == 0 {
			return invalidKey("the key contains a NUL byte")
		}
		if c < 0x20 || c == 0x7f {
			return invalidKey("the key contains the control character %#02x", c)
		}
	}
	if key[0] == '/' {
		return invalidKey("the key starts with \"/\"")
	}
	if key[len(key)-1] == '/' {
		return invalidKey("the key ends with \"/\" (directory objects are not supported)")
	}
	for comp := range strings.SplitSeq(key, "/") {
		switch {
		case comp == "":
			return invalidKey("the key has an empty path component (\"//\")")
		case comp == "." || comp == "..":
			return dotSegment(comp)
		case len(comp) > maxComponentLen:
			return s3err.APIError{
				Code: "KeyTooLongError",
				Description: fmt.Sprintf("Your key is too long: a path component of the key is %d bytes, at most %d are allowed.",
					len(comp), maxComponentLen),
				HTTPStatusCode: http.StatusBadRequest,
			}
		case strings.HasPrefix(comp, reservedPrefix):
			return invalidKey("path components starting with %q are reserved", reservedPrefix)
		}
	}
	return nil
}

// readKey is checkKey for reads: an invalid key names no object.
func readKey(key string) error {
	if checkKey(key) != nil {
		return errNoSuchKey()
	}
	return nil
}

// checkBucketName applies S3's bucket naming rules (3-63 characters of
// a-z, 0-9, '.' and '-', starting and ending with a letter or digit, no
// "..", not an IP address). s3api checks them too; this check is what
// guarantees Root/<bucket> is a direct child of Root.
func checkBucketName(name string) error {
	bad := func(why string) error {
		return s3err.APIError{
			Code:           "InvalidBucketName",
			Description:    fmt.Sprintf("The specified bucket is not valid: %s.", why),
			HTTPStatusCode: http.StatusBadRequest,
		}
	}
	if len(name) < 3 || len(name) > 63 {
		return bad("a bucket name has 3 to 63 characters")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return bad("only lowercase letters, digits, '.' and '-' are allowed")
		}
	}
	if !isAlnum(name[0]) || !isAlnum(name[len(name)-1]) {
		return bad("a bucket name starts and ends with a letter or digit")
	}
	if strings.Contains(name, "..") {
		return bad("a bucket name has no \"..\"")
	}
	if isIPv4(name) {
		return bad("a bucket name is not an IP address")
	}
	return nil
}

func isAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isIPv4(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 3 {
			return false
		}
		for i := 0; i < len(p); i++ {
			if p[i] < '0' || p[i] > '9' {
				return false
			}
		}
	}
	return true
}

// s3apiKeyError is the answer to a request whose key s3api refuses
// itself, before the backend sees it: keys that clean to "", ".", ".."
// or "/", or that leave the bucket ("a/../../b"). s3api answers those
// with a bare 400 "Bad Request" (versitygw v1.8.0,
// middlewares.BucketObjectNameValidator); Middleware answers them first
// with checkKey's explanation. It returns nil for every key s3api lets
// through, so the backend's own checks answer those as before.
func s3apiKeyError(key string) error {
	if key == "" || utils.IsObjectNameValid(key) {
		return nil
	}
	// Name the segment first: "a/../" is refused for its ".." rather
	// than for its trailing "/".
	for comp := range strings.SplitSeq(key, "/") {
		if comp == "." || comp == ".." {
			return dotSegment(comp)
		}
	}
	if err := checkKey(key); err != nil {
		return err
	}
	// checkKey refuses every key s3api does (any "." or ".." segment, a
	// leading "/"); this is only a safety net should s3api's rule grow.
	return invalidKey("the key does not name a path inside the bucket")
}
