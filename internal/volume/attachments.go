package volume

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
)

// Attach grants host access to a volume over NBD in mode rw or ro.
//
// Rules (brief §4): one rw attachment at a time; any number of ro
// attachments while all attachments are ro; a multiattach volume takes any
// number of either. The export name is a fresh 160-bit secret.
func (s *Service) Attach(ctx context.Context, c Caller, volumeRef, host, mode string) (*meta.Attachment, error) {
	if mode == "" {
		mode = meta.ModeRW
	}
	if mode != meta.ModeRW && mode != meta.ModeRO {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "mode must be rw or ro, not %q", mode)
	}
	if ip, err := netip.ParseAddr(host); !hostRE.MatchString(host) && (err != nil || ip.Zone() != "") {
		return nil, errs.Invalid(errs.CodeInvalidRequest, "host %q is not a valid host name", host)
	}
	v, err := s.resolveVolume(ctx, c, volumeRef)
	if err != nil {
		return nil, err
	}
	a := &meta.Attachment{
		ID: newID("att-"), VolumeID: v.ID, Owner: v.Owner, OwnerID: v.OwnerID,
		Host: host, Mode: mode, Export: exportSecret(), CreatedAt: now(),
	}
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Volume(v.ID)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.NotFound("volume", volumeRef)
		}
		if cur.Status != meta.StatusAvailable && cur.Status != meta.StatusInUse {
			return errs.Conflict(errs.CodeVolumeBusy, "volume %s is %s; only an available or in-use volume can be attached", cur.ID, cur.Status)
		}
		if !cur.Multiattach {
			for _, id := range cur.Attachments {
				other, err := tx.Attachment(id)
				if err != nil {
					return err
				}
				if other == nil {
					continue
				}
				if mode == meta.ModeRW || other.Mode == meta.ModeRW {
					return errs.Conflict(errs.CodeAttachConflict,
						"volume %s is attached %s to host %s (%s); a volume without multiattach takes one rw attachment, or only ro ones",
						cur.ID, other.Mode, other.Host, other.ID)
				}
			}
		}
		cur.Attachments = append(cur.Attachments, a.ID)
		cur.Status, cur.UpdatedAt = meta.StatusInUse, now()
		tx.PutVolume(cur)
		tx.PutAttachment(a)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.logFor("volume", v.ID).Info("attached", "attachment", a.ID, "host", host, "mode", mode)
	if mode == meta.ModeRW {
		// This node serves it unless another already writes the volume
		// (multiattach); without a lease now, whoever is asked later.
		if _, _, err := s.leases.acquire(ctx, v.ID); err != nil {
			s.logFor("volume", v.ID).Warn("no write lease at attach", "err", err)
		}
	}
	return a, nil
}

// ServingNode is the node that serves attachment a. A rw attachment is
// served by its volume's write-lease holder (this node takes the lease if
// nobody holds it). An ro attachment is served by any node — through the
// stack it opens for readers — unless its volume is multiattach and
// another node holds the write lease: that node's writes reach a reader
// only through the writer's own stack (a reader's stack elsewhere would
// read its chunks from where they were when it opened), so the attachment
// is served there. An ro attachment never takes the lease.
func (s *Service) ServingNode(ctx context.Context, a *meta.Attachment) (string, error) {
	if a.Mode == meta.ModeRW {
		return s.leases.servingNode(ctx, a.VolumeID)
	}
	v, err := s.meta.Volume(ctx, a.VolumeID)
	if err != nil || !v.Multiattach {
		return s.cfg.Node, err
	}
	h, err := s.leases.holder(ctx, a.VolumeID)
	if err != nil {
		return "", err
	}
	if h != nil && !h.Released {
		return h.Node, nil
	}
	return s.cfg.Node, nil
}

// Detach removes an attachment. This node closes the attachment's NBD
// connections at once; every other node as it sees the deletion (see
// Exports.Run).
func (s *Service) Detach(ctx context.Context, c Caller, id string) error {
	a, err := s.Attachment(ctx, c, id)
	if err != nil {
		return err
	}
	err = s.meta.Update(ctx, func(tx *meta.Tx) error {
		cur, err := tx.Attachment(a.ID)
		if err != nil {
			return err
		}
		if cur == nil {
			return errs.NotFound("attachment", id)
		}
		tx.DeleteAttachment(cur)
		v, err := tx.Volume(cur.VolumeID)
		if err != nil || v == nil {
			return err
		}
		v.Attachments = slices.DeleteFunc(v.Attachments, func(x string) bool { return x == cur.ID })
		if v.Status == meta.StatusInUse && len(v.Attachments) == 0 {
			v.Status = meta.StatusAvailable
		}
		v.UpdatedAt = now()
		tx.PutVolume(v)
		return nil
	})
	if err != nil {
		return err
	}
	s.logFor("volume", a.VolumeID).Info("detached", "attachment", a.ID, "host", a.Host)
	if x := s.exports.Load(); x != nil {
		x.revoke(a.ID)
	}
	if v, err := s.meta.Volume(ctx, a.VolumeID); err == nil && !hasRW(ctx, s, v) {
		s.leases.release(ctx, a.VolumeID) // no writer left: free the volume
	}
	return nil
}

// DetachAllOf detaches every attachment of the user whose record id is
// ownerID, a user just deleted, and returns how many it detached. An
// attachment's export name is a bearer secret its user learned: left in
// place, it would let a deleted user go on reading and writing the volume
// over plain NBD, which no certificate guards. Detached, the name stops
// working and its connections close on every node; an administrator may
// attach the volume again. (A TLS connection closes anyway: its
// certificate no longer authenticates.)
func (s *Service) DetachAllOf(ctx context.Context, ownerID string) (int, error) {
	owner := Caller{ID: ownerID}
	atts, err := s.Attachments(ctx, owner, "")
	if err != nil {
		return 0, fmt.Errorf("attachments of %s: %w", ownerID, err)
	}
	n := 0
	for _, a := range atts {
		err := s.Detach(ctx, owner, a.ID)
		if errs.IsCode(err, errs.CodeNotFound) {
			continue // detached meanwhile
		}
		if err != nil {
			return n, fmt.Errorf("detach %s: %w", a.ID, err)
		}
		n++
	}
	return n, nil
}

// Attachment returns an attachment the caller may see.
func (s *Service) Attachment(ctx context.Context, c Caller, id string) (*meta.Attachment, error) {
	return fetchVisible(c, "attachment", id, func() (*meta.Attachment, error) { return s.meta.Attachment(ctx, id) })
}

// Attachments lists the attachments the caller may see, optionally of one
// volume, oldest first (lists.go).
func (s *Service) Attachments(ctx context.Context, c Caller, volumeRef string) ([]*meta.Attachment, error) {
	return s.AttachmentsPage(ctx, c, volumeRef, meta.Page{})
}

// exportSecret is an unguessable NBD export name (160 random bits).
func exportSecret() string {
	b := make([]byte, 20)
	rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}
