package api

import (
	"context"
	"net/http"
	"time"

	"github.com/basalt-storage/basalt/internal/errs"
	"github.com/basalt-storage/basalt/internal/meta"
	"github.com/basalt-storage/basalt/internal/pki"
	"github.com/basalt-storage/basalt/internal/user"
	"github.com/basalt-storage/basalt/internal/volume"
)

func (s *Server) createUser(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	req, err := ParseCreateUser(body)
	if err != nil {
		return err
	}
	u, id, err := s.d.Users.Create(r.Context(), user.Spec{Name: req.Name, UID: req.UID, GID: req.GID, Admin: req.Admin})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, CreateUserResponse{User: userOut(u), Identity: identityOut(id)})
	return nil
}

func identityOut(id *pki.Identity) Identity {
	return Identity{
		CAPEM: string(id.CAPEM), CertPEM: string(id.CertPEM), KeyPEM: string(id.KeyPEM),
		AccessKeyID: id.AccessKeyID, SecretAccessKey: id.SecretAccessKey,
		S3Endpoint: id.S3Endpoint, S3Region: id.S3Region, S3CABundle: id.S3CABundle,
	}
}

// userCredentials issues new credentials for a user, revoking the
// earlier ones (administrators only).
func (s *Server) userCredentials(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	u, id, err := s.d.Users.RotateCredentials(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, CredentialsResponse{User: userOut(u), Identity: identityOut(id)})
	return nil
}

func (s *Server) listUsers(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	us, err := s.d.Users.List(r.Context())
	if err != nil {
		return err
	}
	out := make([]User, 0, len(us))
	for _, u := range us {
		out = append(out, userOut(u))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// showUser: admin sees anyone, a user sees only themself.
func (s *Server) showUser(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	name := r.PathValue("name")
	if !c.Admin && name != c.Name {
		return errs.NotFound("user", name)
	}
	u, err := s.d.Users.Get(r.Context(), name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, userOut(u))
	return nil
}

func (s *Server) deleteUser(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	name := r.PathValue("name")
	id, err := s.d.Users.Delete(r.Context(), name)
	if id == "" {
		return err
	}
	// Deleted: its attachments go too (DetachAllOf says why), also when
	// this node has yet to see the deletion (err).
	if n, derr := s.d.Volumes.DetachAllOf(r.Context(), id); derr != nil {
		return errs.New(errs.KindUnavailable, errs.CodeMetadataUnavailable,
			"user %s deleted, but %d of its attachments were detached before this failed: %v; detach the rest (basalt attachment list, basalt detach)", name, n, derr)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	req, err := ParseCreateVolume(body)
	if err != nil {
		return err
	}
	v, err := s.d.Volumes.CreateVolume(r.Context(), c, req)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if v.Status == meta.StatusCreating {
		status = http.StatusAccepted
	}
	return s.writeVolume(w, r, c, status, v)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	vs, err := s.d.Volumes.VolumesPage(r.Context(), c, wanted(r))
	if err != nil {
		return err
	}
	if vs, err = page(w, r, vs); err != nil {
		return err
	}
	// The attachments of the page's volumes, by the ids they name.
	byVolume, err := s.d.Volumes.VolumeAttachments(r.Context(), c, vs...)
	if err != nil {
		return err
	}
	// Every attachment's URI names its serving node: one read of the
	// page's write leases for them all, not one each.
	ids := make([]string, 0, len(vs))
	for _, v := range vs {
		if len(byVolume[v.ID]) > 0 {
			ids = append(ids, v.ID)
		}
	}
	ctx := volume.WithServingNodes(r.Context(), ids)
	out := make([]Volume, 0, len(vs))
	for _, v := range vs {
		out = append(out, s.volumeOut(ctx, v, byVolume[v.ID]))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showVolume(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	v, err := s.d.Volumes.Volume(r.Context(), c, r.PathValue("id"))
	if err != nil {
		return err
	}
	out, err := s.volumeWithAttachments(r, c, v)
	if err != nil {
		return err
	}
	if out.Stack, err = s.d.Volumes.Stack(r.Context(), v); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// writeVolume renders a volume with its attachments.
func (s *Server) writeVolume(w http.ResponseWriter, r *http.Request, c volume.Caller, status int, v *meta.Volume) error {
	out, err := s.volumeWithAttachments(r, c, v)
	if err != nil {
		return err
	}
	writeJSON(w, status, out)
	return nil
}

func (s *Server) volumeWithAttachments(r *http.Request, c volume.Caller, v *meta.Volume) (Volume, error) {
	var as []*meta.Attachment
	if len(v.Attachments) > 0 {
		byVolume, err := s.d.Volumes.VolumeAttachments(r.Context(), c, v)
		if err != nil {
			return Volume{}, err
		}
		as = byVolume[v.ID]
	}
	return s.volumeOut(r.Context(), v, as), nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	if err := s.d.Volumes.DeleteVolume(r.Context(), c, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) extendVolume(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	n, err := ParseExtendVolume(body)
	if err != nil {
		return err
	}
	v, err := s.d.Volumes.ExtendVolume(r.Context(), c, r.PathValue("id"), n)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if v.Status == meta.StatusExtending {
		// The volume's writer, another node, had not extended it when
		// the call stopped waiting (volume.Config.DelegateWait): it goes on
		// there, and may still fail. 202, as for a snapshot handed on
		// and not taken yet — not 200 with a size the volume does not
		// have yet.
		status = http.StatusAccepted
	}
	return s.writeVolume(w, r, c, status, v)
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	req, err := ParseCreateSnapshot(body)
	if err != nil {
		return err
	}
	sn, err := s.d.Volumes.CreateSnapshot(r.Context(), c, req.Volume, req.Name, req.ClientToken)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if sn.Status == meta.StatusCreating {
		status = http.StatusAccepted
	}
	writeJSON(w, status, snapshotOut(sn))
	return nil
}

// volumeFilter is the ?volume= of a list, "" for none. Given empty
// (?volume=, a script's "?volume=$VOL" with VOL unset) it is refused:
// read as none, it answered the unfiltered list (every attachment's
// export secret included), as a misspelt filter did (checkQuery).
func volumeFilter(r *http.Request) (string, error) {
	q := r.URL.Query()
	if q.Has("volume") && q.Get("volume") == "" {
		return "", errs.Invalid(errs.CodeInvalidRequest, "query parameter volume is empty: give a volume's id or name, or leave the parameter out for every one")
	}
	return q.Get("volume"), nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	vol, err := volumeFilter(r)
	if err != nil {
		return err
	}
	ss, err := s.d.Volumes.SnapshotsPage(r.Context(), c, vol, wanted(r))
	if err != nil {
		return err
	}
	if ss, err = page(w, r, ss); err != nil {
		return err
	}
	out := make([]Snapshot, 0, len(ss))
	for _, sn := range ss {
		out = append(out, snapshotOut(sn))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showSnapshot(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	sn, err := s.d.Volumes.Snapshot(r.Context(), c, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snapshotOut(sn))
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	if err := s.d.Volumes.DeleteSnapshot(r.Context(), c, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func userOut(u *meta.User) User {
	out := User{Name: u.Name, Admin: u.Admin, UID: u.UID, GID: u.GID, AccessKeyID: u.AccessKeyID, CreatedAt: u.CreatedAt,
		Certificates: []Certificate{}, LegacyCertificates: !u.CertsListed}
	now := time.Now()
	for _, c := range u.Certs {
		if !now.After(c.NotAfter) { // expired ones leave the list at its next write
			out.Certificates = append(out.Certificates, Certificate{Serial: c.Serial, NotAfter: c.NotAfter, IssuedFor: c.IssuedFor})
		}
	}
	return out
}

func progressOut(j *meta.Job) *Progress {
	if j == nil {
		return nil
	}
	p := &Progress{Job: j.Kind, Done: j.Done, Total: j.Total, Phase: j.Phase, Object: j.Object}
	if j.Total > 0 {
		p.Percent = float64(int(float64(j.Done)/float64(j.Total)*1000)) / 10
	}
	return p
}

func (s *Server) volumeOut(ctx context.Context, v *meta.Volume, as []*meta.Attachment) Volume {
	out := Volume{ID: v.ID, Name: v.Name, SizeBytes: v.SizeBytes, Status: v.Status, StatusMessage: v.StatusMessage,
		Type: v.Type, Owner: v.Owner, Multiattach: v.Multiattach, SourceSnapshot: v.SourceSnapshot,
		SourceObject: v.SourceObject, CreatedAt: v.CreatedAt, Attachments: []Attachment{},
		Progress: progressOut(v.Job), LastJob: resultOut(v.LastJob)}
	for _, a := range as {
		out.Attachments = append(out.Attachments, s.attachmentOut(ctx, a))
	}
	return out
}

func (s *Server) attachmentOut(ctx context.Context, a *meta.Attachment) Attachment {
	return Attachment{ID: a.ID, VolumeID: a.VolumeID, Host: a.Host, Mode: a.Mode, Status: "attached",
		NBDURI: s.d.NBDURI(ctx, a), Export: a.Export, CreatedAt: a.CreatedAt}
}

func (s *Server) attach(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	req, err := ParseAttach(body)
	if err != nil {
		return err
	}
	a, err := s.d.Volumes.Attach(r.Context(), c, req.Volume, req.Host, req.Mode)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.attachmentOut(r.Context(), a))
	return nil
}

func (s *Server) listAttachments(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	vol, err := volumeFilter(r)
	if err != nil {
		return err
	}
	as, err := s.d.Volumes.AttachmentsPage(r.Context(), c, vol, wanted(r))
	if err != nil {
		return err
	}
	if as, err = page(w, r, as); err != nil {
		return err
	}
	ids := make([]string, 0, len(as))
	for _, a := range as {
		ids = append(ids, a.VolumeID)
	}
	ctx := volume.WithServingNodes(r.Context(), ids) // one read of the page's write leases (listVolumes)
	out := make([]Attachment, 0, len(as))
	for _, a := range as {
		out = append(out, s.attachmentOut(ctx, a))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showAttachment(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	a, err := s.d.Volumes.Attachment(r.Context(), c, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.attachmentOut(r.Context(), a))
	return nil
}

func (s *Server) detach(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	if err := s.d.Volumes.Detach(r.Context(), c, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func resultOut(j *meta.JobResult) *JobResult {
	if j == nil {
		return nil
	}
	return &JobResult{Job: j.Kind, Error: j.Error, Report: j.Report, FinishedAt: j.Finished}
}

func snapshotOut(sn *meta.Snapshot) Snapshot {
	return Snapshot{ID: sn.ID, Name: sn.Name, VolumeID: sn.VolumeID, SizeBytes: sn.SizeBytes, Status: sn.Status,
		StatusMessage: sn.StatusMessage, Owner: sn.Owner, CreatedAt: sn.CreatedAt,
		Progress: progressOut(sn.Job), LastJob: resultOut(sn.LastJob)}
}

func (s *Server) exportSnapshot(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	req, err := ParseExportSnapshot(body)
	if err != nil {
		return err
	}
	sn, err := s.d.Volumes.ExportSnapshot(r.Context(), c, r.PathValue("id"), req.To)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, snapshotOut(sn))
	return nil
}

func (s *Server) volumeJob(kind string) handler {
	return func(w http.ResponseWriter, r *http.Request, c volume.Caller) error {
		v, err := s.d.Volumes.StartJob(r.Context(), c, r.PathValue("id"), kind)
		if err != nil {
			return err
		}
		return s.writeVolume(w, r, c, http.StatusAccepted, v)
	}
}

func typeOut(t *volume.VolumeType) VolumeType {
	return VolumeType{Name: t.Name, Description: t.Description, Stack: t.Stack, BuiltIn: t.BuiltIn}
}

func (s *Server) listTypes(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	ts, err := s.d.Volumes.VolumeTypes(r.Context())
	if err != nil {
		return err
	}
	out := make([]VolumeType, 0, len(ts))
	for i := range ts {
		out = append(out, typeOut(&ts[i]))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showType(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	t, err := s.d.Volumes.VolumeType(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, typeOut(t))
	return nil
}

func (s *Server) createType(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	body, err := readBody(r.Body)
	if err != nil {
		return err
	}
	req, err := ParseCreateVolumeType(body)
	if err != nil {
		return err
	}
	t, err := s.d.Volumes.CreateVolumeType(r.Context(), req.Name, req.Description, req.Stack)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, typeOut(t))
	return nil
}

func (s *Server) deleteType(w http.ResponseWriter, r *http.Request, _ volume.Caller) error {
	if err := s.d.Volumes.DeleteVolumeType(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
