package checksum

import (
	"container/list"
	"encoding/binary"
	"hash/crc32"
	"sync"
)

// On-disk layout of the child (see the package comment).
const (
	// BlockSize is the unit a checksum covers.
	BlockSize = 4096
	// TableEntries is the number of data blocks one table block covers.
	TableEntries = BlockSize / 4
	// GroupData is the number of data bytes in one group.
	GroupData = TableEntries * BlockSize
	// ExtentGroups is the number of groups in one extent: their tables
	// come first (ExtentTables bytes), then their data, so that data
	// offsets keep their alignment in the child up to ExtentTables.
	ExtentGroups = 1024
	// ExtentTables is the size of an extent's table area (4 MiB).
	ExtentTables = ExtentGroups * BlockSize
	// ExtentData is the number of data bytes in one extent (4 GiB).
	ExtentData = ExtentGroups * GroupData
	// extentSpan is the number of child bytes one full extent occupies.
	extentSpan = ExtentTables + ExtentData
)

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	zeroBlock  [BlockSize]byte
	// zeroCRC is CRC-32C of a block of zeroes. Entries are stored XORed
	// with it so that a block of zeroes has entry 0 — the value a fresh
	// (sparse, zero-filled) child holds in its tables.
	zeroCRC = crc32.Checksum(zeroBlock[:], castagnoli)
)

// entryOf is the table entry of a block holding data: CRC-32C of the
// block zero-padded to BlockSize (only the last block of a device whose
// size is not a multiple of BlockSize is shorter), XOR CRC-32C of a zero
// block. CRC-32C is affine over fixed-length messages, so this is its
// linear part: exactly one entry per content, and 0 for zeroes, with no
// reserved or substituted values.
func entryOf(data []byte) uint32 {
	c := crc32.Update(0, castagnoli, data)
	if pad := BlockSize - len(data); pad > 0 {
		c = crc32.Update(c, castagnoli, zeroBlock[:pad])
	}
	return c ^ zeroCRC
}

// ChildSize is the size of the child a checksum layer of size bytes needs:
// the data plus a whole table area per started extent.
func ChildSize(size int64) int64 {
	return size + (size+ExtentData-1)/ExtentData*ExtentTables
}

// DataSize is the size a checksum layer presents over a child of
// childSize bytes; DataSize(ChildSize(n)) == n for every n >= 0. A child
// ending inside an extent's table area holds none of that extent's data.
func DataSize(childSize int64) int64 {
	x, r := childSize/extentSpan, childSize%extentSpan
	return x*ExtentData + max(0, r-ExtentTables)
}

// groupsFor is the number of groups holding size data bytes.
func groupsFor(size int64) int64 { return (size + GroupData - 1) / GroupData }

// tableOff is the child offset of group g's table block.
func tableOff(g int64) int64 {
	return g/ExtentGroups*extentSpan + g%ExtentGroups*BlockSize
}

// dataOff is the child offset of data offset off. Data offsets inside one
// extent (hence inside one group) are contiguous in the child, and
// dataOff(off) ≡ off modulo ExtentTables: a request aligned to 1 MiB (a
// Lustre stripe, a GPFS block, a huge page) stays aligned below.
func dataOff(off int64) int64 {
	return off/ExtentData*extentSpan + ExtentTables + off%ExtentData
}

// table is a group's checksum table, decoded. Clean tables (cached or
// pinned) are never modified: writers change a copy, which becomes the
// group's dirty table or is written through. A dirty table is changed in
// place, under its group's lock held exclusively.
type table [TableEntries]uint32

func decodeTable(raw []byte) *table {
	t := new(table)
	for i := range t {
		t[i] = binary.BigEndian.Uint32(raw[4*i:])
	}
	return t
}

func (t *table) encode() []byte {
	raw := make([]byte, BlockSize)
	for i, e := range t {
		binary.BigEndian.PutUint32(raw[4*i:], e)
	}
	return raw
}

// tableCache keeps recently used tables that equal the child's: an entry
// is put only after the table was read from, or successfully written to,
// the child, while the caller holds the group's lock (shared for a read,
// exclusive for a write). Tables changed since they were last written are
// in dirtyTables instead, which is consulted first.
type tableCache struct {
	mu  sync.Mutex
	max int
	m   map[int64]*list.Element
	lru list.List // front: most recently used; values are cacheEntry
}

type cacheEntry struct {
	g int64
	t *table
}

func newTableCache(max int) *tableCache {
	return &tableCache{max: max, m: map[int64]*list.Element{}}
}

func (c *tableCache) get(g int64) *table {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[g]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(cacheEntry).t
	}
	return nil
}

func (c *tableCache) put(g int64, t *table) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[g]; ok {
		e.Value = cacheEntry{g, t}
		c.lru.MoveToFront(e)
		return
	}
	c.m[g] = c.lru.PushFront(cacheEntry{g, t})
	for c.lru.Len() > c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.m, old.Value.(cacheEntry).g)
	}
}

func (c *tableCache) drop(g int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[g]; ok {
		c.lru.Remove(e)
		delete(c.m, g)
	}
}

// dirtyTables holds the tables changed by writes but not yet written to
// the child (write-back: Flush writes them, before it flushes the child).
// An entry changes only under its group's lock held exclusively; readers
// hold it shared. Entries are never evicted: the set is bounded by max,
// and a writer that finds it full writes its table through instead.
type dirtyTables struct {
	mu  sync.Mutex
	max int
	m   map[int64]*table
}

func newDirtyTables(max int) *dirtyTables {
	return &dirtyTables{max: max, m: map[int64]*table{}}
}

func (d *dirtyTables) get(g int64) *table {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[g]
}

// put records t as group g's table; false if the set is full (and g is
// not in it).
func (d *dirtyTables) put(g int64, t *table) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.m[g]; !ok && len(d.m) >= d.max {
		return false
	}
	d.m[g] = t
	return true
}

func (d *dirtyTables) drop(g int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, g)
}

// groups lists the groups with a dirty table, in no order.
func (d *dirtyTables) groups() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]int64, 0, len(d.m))
	for g := range d.m {
		out = append(out, g)
	}
	return out
}
