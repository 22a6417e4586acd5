package volume

import (
	"context"
	"slices"

	"github.com/basalt-storage/basalt/internal/meta"
)

// Lists. A user's lists are read through the metadata's owned index
// (meta.OwnedVolumes…): the user's records, or a page of them, and
// nothing else, however many records the cluster holds. An admin's lists
// of everything are read the same way through its all-owners keys
// (meta.AllVolumes…), which order every owner's records together: a page
// of them, nothing else. A list of one volume's snapshots or attachments
// reads that volume's only, for admins too. Every list is in
// meta.Position order: oldest first, ties by id.

// VolumesPage lists the part p asks for of the volumes the caller may
// see.
func (s *Service) VolumesPage(ctx context.Context, c Caller, p meta.Page) ([]*meta.Volume, error) {
	if !c.Admin {
		return s.meta.OwnedVolumes(ctx, c.ID, p)
	}
	return s.meta.AllVolumes(ctx, p)
}

// SnapshotsPage lists the part p asks for of the snapshots the caller may
// see, of one volume if volumeRef names one.
func (s *Service) SnapshotsPage(ctx context.Context, c Caller, volumeRef string, p meta.Page) ([]*meta.Snapshot, error) {
	if volumeRef != "" {
		v, err := s.resolveVolume(ctx, c, volumeRef)
		if err != nil {
			return nil, err
		}
		// A volume's snapshots are its owner's (CreateSnapshot gives
		// them the volume's owner), whoever asks.
		return s.meta.OwnedSnapshots(ctx, v.OwnerID, p, func(sn *meta.Snapshot) bool { return sn.VolumeID == v.ID })
	}
	if !c.Admin {
		return s.meta.OwnedSnapshots(ctx, c.ID, p, nil)
	}
	return s.meta.AllSnapshots(ctx, p)
}

// AttachmentsPage lists the part p asks for of the attachments the caller
// may see, of one volume if volumeRef names one.
func (s *Service) AttachmentsPage(ctx context.Context, c Caller, volumeRef string, p meta.Page) ([]*meta.Attachment, error) {
	if volumeRef != "" {
		v, err := s.resolveVolume(ctx, c, volumeRef)
		if err != nil {
			return nil, err
		}
		byVolume, err := s.VolumeAttachments(ctx, c, v)
		if err != nil {
			return nil, err
		}
		return cut(byVolume[v.ID], p), nil
	}
	if !c.Admin {
		return s.meta.OwnedAttachments(ctx, c.ID, p)
	}
	return s.meta.AllAttachments(ctx, p)
}

// VolumeAttachments returns the attachments of volumes vs that the caller
// may see, by volume id, each volume's in list order. It reads the
// attachments the volume records name (a volume lists exactly the
// attachments naming it), not every attachment.
func (s *Service) VolumeAttachments(ctx context.Context, c Caller, vs ...*meta.Volume) (map[string][]*meta.Attachment, error) {
	out := map[string][]*meta.Attachment{}
	var ids []string
	seen, listed := map[string]bool{}, map[string]bool{}
	for _, v := range vs {
		listed[v.ID] = true
		for _, id := range v.Attachments {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return out, nil
	}
	as, err := s.meta.AttachmentsByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	as = slices.DeleteFunc(as, func(a *meta.Attachment) bool { return !c.sees(a.OwnedBy()) || !listed[a.VolumeID] })
	slices.SortFunc(as, byPosition)
	for _, a := range as {
		out[a.VolumeID] = append(out[a.VolumeID], a)
	}
	return out, nil
}

// positioned is a record with a place in lists.
type positioned interface{ Position() meta.Position }

func byPosition[T positioned](a, b T) int {
	switch pa, pb := a.Position(), b.Position(); {
	case pa.Before(pb):
		return -1
	case pb.Before(pa):
		return 1
	}
	return 0
}

// cut keeps the part p asks for of list, which is in list order.
func cut[T positioned](list []T, p meta.Page) []T {
	if p.After != nil {
		i := 0
		for i < len(list) && !p.After.Before(list[i].Position()) {
			i++
		}
		list = list[i:]
	}
	if p.Limit > 0 && len(list) > p.Limit {
		list = list[:p.Limit]
	}
	return list
}
