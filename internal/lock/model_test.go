package lock

// The model: a specification of the lock written without etcd, revisions or
// admission records, used as the oracle of the script tests
// (testdata/*.txt) and of the exhaustive test.
//
// A resource has a queue of requests in arrival order; each is waiting, held
// or (an update holder) upgrading. The rules:
//   - a waiting request may be granted when its mode is compatible with
//     every request ahead of it (an upgrading one counts as write, a waiting
//     one by the mode it asks for, so nobody passes a conflicting waiter) and
//     with every holder behind it;
//   - an upgrading holder becomes a write holder when nobody else holds the
//     lock and nobody is ahead of it (only readers can be: they were let in
//     before it, or are about to be);
//   - try-acquire is granted when a new request would be, otherwise leaves
//     no trace; try-upgrade likewise;
//   - cancel withdraws a waiting request or turns an upgrading holder back
//     into an update holder; release and kill (session death) remove.
//
// The real service decides grants only when a waiter looks (polls); so does
// the model: "grantable" is evaluated at the moment of the poll.

import "fmt"

// mCompatible is seed 004's table 1 written out again, not Mode.Compatible:
// a model that asked the service's own function would agree with a wrong
// entry there (TestExhaustive passed with read and update made
// incompatible both ways; only testdata/compat.txt noticed).
func mCompatible(a, b Mode) bool {
	table := map[Mode]map[Mode]bool{
		Read:   {Read: true, Update: true, Write: false},
		Update: {Read: true, Update: false, Write: false},
		Write:  {Read: false, Update: false, Write: false},
	}
	return table[a][b]
}

type mState int

const (
	mWaiting mState = iota
	mHeld
	mUpgrading
)

type mEntry struct {
	client int
	mode   Mode // requested or held mode; Update while upgrading
	st     mState
}

type model struct{ q []mEntry }

func (m *model) find(c int) int {
	for i, e := range m.q {
		if e.client == c {
			return i
		}
	}
	return -1
}

// state describes client c as the harness does.
func (m *model) state(c int) string {
	i := m.find(c)
	if i < 0 {
		return "idle"
	}
	e := m.q[i]
	switch e.st {
	case mWaiting:
		return "waits " + e.mode.String()
	case mUpgrading:
		return "upgrading"
	}
	return "holds " + e.mode.String()
}

// grantable says whether the request at i would be granted if it looked now.
func (m *model) grantable(i int) bool {
	e := m.q[i]
	for j, o := range m.q {
		if j == i {
			continue
		}
		switch {
		case e.st == mUpgrading:
			// Done when nobody else holds and nobody is ahead.
			if o.st != mWaiting || j < i {
				return false
			}
		case j < i && o.st == mUpgrading:
			if !mCompatible(e.mode, Write) {
				return false
			}
		case j < i || o.st != mWaiting:
			if !mCompatible(e.mode, o.mode) {
				return false
			}
		}
	}
	return true
}

// check asserts the model's own safety invariant: held requests pairwise
// compatible (upgrading counts as update: readers may still be there).
func (m *model) check() error {
	for i, a := range m.q {
		for j, b := range m.q[i+1:] {
			if a.st == mWaiting || b.st == mWaiting {
				continue
			}
			if !mCompatible(a.mode, b.mode) {
				return fmt.Errorf("model: entries %d and %d (%v, %v) held together", i, i+1+j, a, b)
			}
		}
	}
	return nil
}

// apply performs an operation and returns its outcome: "granted", "waits",
// "conflict", "ok", or an error for an operation the state does not allow.
// Admit is a poll as far as the model is concerned (see harness.do).
func (m *model) apply(o op) (string, error) {
	i := m.find(o.client)
	switch o.kind {
	case opAcquire, opTry:
		if i >= 0 {
			return "", fmt.Errorf("client busy")
		}
		m.q = append(m.q, mEntry{client: o.client, mode: o.mode})
		i = len(m.q) - 1
		if m.grantable(i) {
			m.q[i].st = mHeld
			return "granted", nil
		}
		if o.kind == opTry {
			m.q = m.q[:i]
			return "conflict", nil
		}
		return "waits", nil
	}
	if i < 0 {
		return "", fmt.Errorf("client idle")
	}
	e := &m.q[i]
	switch o.kind {
	case opPoll, opAdmit:
		if e.st == mHeld {
			return "", fmt.Errorf("nothing to poll")
		}
		if !m.grantable(i) {
			return "waits", nil
		}
		if e.st == mUpgrading {
			e.mode = Write
		}
		e.st = mHeld
		return "granted", nil
	case opCancel:
		switch e.st {
		case mWaiting:
			m.q = append(m.q[:i], m.q[i+1:]...)
		case mUpgrading:
			e.st = mHeld
		default:
			return "", fmt.Errorf("nothing to cancel")
		}
		return "ok", nil
	case opRelease:
		if e.st != mHeld {
			return "", fmt.Errorf("not holding")
		}
		m.q = append(m.q[:i], m.q[i+1:]...)
		return "ok", nil
	case opKill:
		m.q = append(m.q[:i], m.q[i+1:]...)
		return "ok", nil
	case opUpgrade, opTryUpgrade:
		if e.st != mHeld || e.mode != Update {
			return "", fmt.Errorf("not an update holder")
		}
		e.st = mUpgrading
		if m.grantable(i) {
			e.st, e.mode = mHeld, Write
			return "granted", nil
		}
		if o.kind == opTryUpgrade {
			e.st = mHeld
			return "conflict", nil
		}
		return "waits", nil
	}
	return "", fmt.Errorf("unknown op %v", o.kind)
}

// Operations, shared by the model, the harness and the scripts.

type opKind int

const (
	opAcquire opKind = iota
	opTry
	opPoll
	opCancel
	opRelease
	opKill
	opUpgrade
	opTryUpgrade
	opAdmit
)

var opNames = map[opKind]string{
	opAcquire: "acquire", opTry: "try", opPoll: "poll", opCancel: "cancel",
	opRelease: "release", opKill: "kill", opUpgrade: "upgrade", opTryUpgrade: "tryupgrade",
	opAdmit: "admit",
}

type op struct {
	client int
	kind   opKind
	mode   Mode // for acquire and try
}

func clientName(c int) string { return string(rune('a' + c)) }

func (o op) String() string {
	s := clientName(o.client) + " " + opNames[o.kind]
	if o.kind == opAcquire || o.kind == opTry {
		s += " " + o.mode.String()
	}
	return s
}

// possible lists the operations the model allows client c now (polls and
// admissions are offered by the harness, which knows who was woken and who
// is admitting).
func (m *model) possible(c int) []op {
	i := m.find(c)
	if i < 0 {
		var out []op
		for _, k := range []opKind{opAcquire, opTry} {
			for md := Read; md <= Write; md++ {
				out = append(out, op{client: c, kind: k, mode: md})
			}
		}
		return out
	}
	switch e := m.q[i]; {
	case e.st == mWaiting || e.st == mUpgrading:
		return []op{{client: c, kind: opCancel}, {client: c, kind: opKill}}
	case e.mode == Update:
		return []op{{client: c, kind: opRelease}, {client: c, kind: opUpgrade},
			{client: c, kind: opTryUpgrade}, {client: c, kind: opKill}}
	default:
		return []op{{client: c, kind: opRelease}, {client: c, kind: opKill}}
	}
}
