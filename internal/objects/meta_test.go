package objects

import (
	"bytes"
	"testing"
)

// FuzzDecodeRecord proves that decodeRecord accepts only records an
// object can be served from — a size of at least 0, at most 10000 part
// ends that never go back and end at the size, a version id that is empty
// or well-formed — whatever bytes a user with direct access put in the
// xattr or the sidecar, and that an accepted record survives being
// written back.
func FuzzDecodeRecord(f *testing.F) {
	for _, m := range []objectMeta{
		{ETag: `"d41d8cd98f00b204e9800998ecf8427e"`, Size: 0, MtimeNs: 1, Inode: 2},
		{ETag: `"x-3"`, Size: 30 << 20, Parts: []int64{10 << 20, 20 << 20, 30 << 20}, VersionID: newVersionID(),
			UserMeta: map[string]string{"a": "b"}, Checksum: &checksum{Algorithm: "CRC32", Value: "AAAAAA=="}},
		{Size: 5, Parts: []int64{5, 5}, Key: "k"},
		manyParts(100, 5<<20, 7),
	} {
		b, err := encodeRecord(&m)
		if err != nil {
			f.Fatal(err)
		}
		if _, err := decodeRecord(b); err != nil {
			f.Fatalf("a record as the gateway writes it does not decode: %s: %v", b, err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		`{"size":-1}`,
		`{"size":10,"parts":[5,3,10]}`,
		`{"size":10,"parts":[-5,10]}`,
		`{"size":10,"parts":[5,9]}`,
		`{"size":10,"parts":[5,11]}`,
		`{"size":1,"version_id":"../../../etc/passwd"}`,
		`{"size":1,"version_id":"null"}`,
		`{"size":1,"parts":[]}`,
		`{"size":10,"part_runs":[[5,2]]}`,
		`{"size":10,"part_runs":[[5,3]]}`,
		`{"size":1,"part_runs":[[1,1000000000000]]}`,
		`{"size":1,"part_runs":[[0,10000],[1,1]]}`,
		`{"size":1,"parts":[1],"part_runs":[[1,1]]}`,
		`{"size":1,"part_runs":[[-1,1],[2,1]]}`,
		`{"size":9223372036854775807,"part_runs":[[9223372036854775807,2]]}`,
		`not json`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeRecord(data)
		if err != nil {
			return
		}
		if m.Size < 0 || len(m.Parts) > maxRecordParts {
			t.Fatalf("accepted size %d with %d parts", m.Size, len(m.Parts))
		}
		for i, end := range m.Parts {
			if end < 0 || i > 0 && end < m.Parts[i-1] || i == len(m.Parts)-1 && end != m.Size {
				t.Fatalf("accepted parts %v of size %d", m.Parts, m.Size)
			}
		}
		if m.VersionID != "" && !validVersionID(m.VersionID) {
			t.Fatalf("accepted version id %q", m.VersionID)
		}
		// Every part serve computes from it is inside the object.
		o := &object{m: m}
		for n := int32(1); n <= int32(max(1, len(m.Parts))); n++ {
			start, length, _, err := o.part(n)
			if err != nil || start < 0 || length < 0 || start+length > m.Size {
				t.Fatalf("part %d of %+v: %d+%d, %v", n, m, start, length, err)
			}
		}
		again, err := encodeRecord(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := decodeRecord(again)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", again, err)
		}
		// (Compared as written: an empty list and none are one record.)
		if third, _ := encodeRecord(m2); !bytes.Equal(third, again) {
			t.Fatalf("re-decoding %s gives %s", again, third)
		}
	})
}

// manyParts is the record of an object of n parts of size and a last
// one of last bytes: more than inlineParts, so stored as part runs.
func manyParts(n int, size, last int64) objectMeta {
	m := objectMeta{ETag: `"x-1"`, Parts: make([]int64, n)}
	for i := range m.Parts {
		m.Parts[i] = int64(i+1) * size
	}
	m.Parts[n-1] = m.Parts[n-2] + last
	m.Size = m.Parts[n-1]
	return m
}
