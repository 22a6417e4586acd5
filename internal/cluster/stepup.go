package cluster

// Stepping up: a client node becomes a voter when the cluster has fewer
// voters than its target — after `node remove` took a voter out, say — so
// that the cluster tolerates as many failures as before without an
// operator joining a new node.

import (
	"context"
	"slices"

	"github.com/basalt-storage/basalt/internal/meta"
)

// StepUp adds the client node req describes (the calling node itself) to
// the cluster's etcd members as a learner if the cluster has fewer voters
// than its target and no learner catching up; it returns what the node
// needs to start its member (Role learner), or nil when no voter is
// wanted. Like Join, it is idempotent: a node that crashed after its
// learner was added finds it (by peer URL) and gets the same answer, so a
// caller retries StepUp at every start until its member runs.
//
// Decided under the join lock, so that two client nodes never both step
// up for one missing voter; the node's record gains its etcd URLs in the
// same critical section (`node remove` finds its member by them).
func (s *Service) StepUp(ctx context.Context, req JoinRequest) (*JoinResponse, error) {
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	// A look without the lock first: every client node asks every few
	// seconds, and almost always no voter is wanted.
	if _, want, err := s.wantsVoter(ctx, req.Peer); err != nil || !want {
		return nil, err
	}
	var resp *JoinResponse
	err := s.withJoinLock(ctx, func(ctx context.Context) error {
		members, want, err := s.wantsVoter(ctx, req.Peer)
		if err != nil || !want {
			return err
		}
		// (wantsVoter matched by peer URL alone: make sure a member with
		// it is this node's, not another's it would start as.)
		mine, err := s.memberFor(ctx, members, req)
		if err != nil {
			return err
		}
		// The record gains the etcd URLs before the learner exists — and
		// again when the learner was found already: a node that crashed
		// after its learner was added restarts as a client, and its
		// registration (Register) drops the URLs it had. Without them
		// the node lists as a client beside a nameless unstarted-<id>
		// learner, and a `node remove` of the node leaves that learner.
		rec, err := s.meta.Node(ctx, req.Name)
		if err != nil {
			return err
		}
		if rec.Peer != req.Peer || rec.Client != req.Client {
			rec.Peer, rec.Client = req.Peer, req.Client
			if err := s.meta.PutNode(ctx, rec); err != nil {
				return err
			}
		}
		if mine < 0 {
			if _, err := s.meta.AddLearner(ctx, req.Peer); err != nil {
				return err
			}
			if members, err = s.meta.Members(ctx); err != nil {
				return err
			}
		}
		resp = &JoinResponse{Role: meta.RoleLearner, InitialCluster: initialCluster(members, req)}
		for _, m := range members {
			if !m.Learner && m.Name != "" {
				resp.Endpoints = append(resp.Endpoints, m.Clients...)
			}
		}
		return nil
	})
	if err != nil || resp == nil {
		return nil, err
	}
	s.log.Info("client node steps up to voter", "node", req.Name, "peer", req.Peer)
	return resp, nil
}

// wantsVoter reports whether the node with etcd peer URL peer should
// become a member — the cluster runs its own etcd, and either a member
// with that peer URL exists already (added before a crash) or the cluster
// has fewer voters than its target and no learner — with the members.
func (s *Service) wantsVoter(ctx context.Context, peer string) ([]meta.Member, bool, error) {
	cl, err := s.meta.Cluster(ctx)
	if err != nil || cl.External {
		return nil, false, err
	}
	members, err := s.meta.Members(ctx)
	if err != nil {
		return nil, false, err
	}
	voters, learners := 0, 0
	for _, m := range members {
		if slices.Contains(m.Peers, peer) {
			return members, true, nil
		}
		if m.Learner {
			learners++
		} else {
			voters++
		}
	}
	return members, voters < cl.Voters && learners == 0, nil
}

// StepDown undoes a StepUp whose member could not start (its ports not
// bindable, say): the learner is removed, so that it does not block every
// later join, and the node's record loses its etcd URLs again.
func (s *Service) StepDown(ctx context.Context, req JoinRequest) error {
	return s.withJoinLock(ctx, func(ctx context.Context) error {
		members, err := s.meta.Members(ctx)
		if err != nil {
			return err
		}
		for _, m := range members {
			if slices.Contains(m.Peers, req.Peer) {
				if !m.Learner {
					return nil // promoted after all: keep it
				}
				if err := s.meta.RemoveMember(ctx, m.ID); err != nil {
					return err
				}
			}
		}
		rec, err := s.meta.Node(ctx, req.Name)
		if err != nil {
			return err
		}
		rec.Peer, rec.Client = "", ""
		return s.meta.PutNode(ctx, rec)
	})
}
