package e2e

import (
	"testing"
)

func TestZZExplore(t *testing.T) {
	n := StartNode(t, NodeOptions{})
	admin := n.Admin()
	for _, typ := range []string{"verified", "encrypted"} {
		v := admin.CreateVolume("--size", "16MiB", "--type", typ)
		rs := []region{{1 * MiB, randomBytes(t, int(3*MiB))}, {15 * MiB, randomBytes(t, int(MiB))}}
		admin.WriteRegions(v.ID, rs)
		s := admin.CreateSnapshot(v.ID)
		for _, size := range []string{"16MiB", "40MiB"} {
			c := admin.CreateVolume("--from-snapshot", s.ID, "--size", size)
			if c.Status != "available" {
				t.Errorf("%s clone %s: %+v", typ, size, c)
				continue
			}
			p := admin.CheckVolume(typ+" clone "+size, c.ID, rs)
			checkRegions(t, typ+" clone zero tail "+size, p, []region{{16 * MiB, make([]byte, fileSize(t, p)-16*MiB)}})
			admin.WriteRegions(c.ID, []region{{fileSize(t, p) - MiB, randomBytes(t, int(MiB))}})
			if typ == "verified" {
				var vv Volume
				admin.OK(&vv, "volume", "scrub", c.ID, "--wait")
				t.Logf("%s %s scrub %s", typ, size, vv.LastJob.Report)
			}
		}
	}
}
