package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
)

// Defaults for the zero values of Config.
const (
	DefaultPrefix      = "gpujob/rendezvous"
	DefaultSessionTTL  = 10 * time.Second
	DefaultJoinTimeout = 5 * time.Minute
	DefaultLastCall    = 5 * time.Second

	// blockWait bounds one blocking query; Consul adds up to 1/16 jitter.
	blockWait = 5 * time.Minute
	// lockDelay replaces Consul's default 15 s lock-delay on our session:
	// a dead coordinator's lock must be re-acquirable at once, and member
	// keys are never re-acquired by anyone else anyway.
	lockDelay = time.Millisecond
	// timeoutGrace is how long past JoinTimeout a Join may spend recording
	// the timeout in Consul (so that every member fails the same way)
	// before it gives up on Consul and returns the timeout on its own.
	timeoutGrace = 2 * time.Second
)

// Config describes a run and how this member takes part in it.
type Config struct {
	Client *api.Client // Consul client
	Prefix string      // KV prefix, default "gpujob/rendezvous"
	// RunID names one run (one submission of a job), e.g.
	// "default/bert-a/<submission>"; keys live under Prefix/RunID/.
	// Replacement members of the same run share its round numbers and
	// restart budget.
	RunID string
	// RunGroup, if set, is the parent of RunID (RunID must be
	// RunGroup + "/" + one more path element), e.g. "default/bert-a":
	// the runs of one job. Open deletes every other run of the group whose
	// members are all gone, so a resubmission starts afresh and dead
	// submissions leave nothing behind.
	RunGroup    string
	SessionTTL  time.Duration // default 10s; renewed by the member every TTL/2
	Min, Max    int           // nnodes "4" => 4,4 ; "2:4" => 2,4
	JoinTimeout time.Duration // default 5m: how long Join waits for a round to complete (and Open for Consul)
	LastCall    time.Duration // with Min<Max: once Min members joined, wait this long for more (default 5s)
	MaxRestarts int           // group-wide restart budget
	Expected    []string      // names of the members that should join, for error messages
	// SessionNodeChecks are the node checks the member's session is bound
	// to. Nil keeps Consul's default, the serfHealth check of the node of
	// the agent the Client talks to: when Consul declares that node failed,
	// the session (and the member) is gone at once, without waiting for
	// its TTL.
	SessionNodeChecks []string
	// SessionTTLOnly binds the session to no node check: it lives as long
	// as it is renewed (Consul invalidates it 2×SessionTTL after the last
	// renewal). Use it when the agent the member talks to may restart
	// with a leave (a client agent with leave_on_terminate), which fails
	// its serfHealth and with it every session bound to it.
	SessionTTLOnly bool
	// Logf, if set, hears of transient Consul errors being retried and of
	// session replacement. It must be safe for concurrent use.
	Logf func(format string, args ...any)
}

// Member is one participant of the run (one Nomad allocation).
type Member struct {
	ID             string // unique, e.g. the Nomad alloc ID
	Name           string // e.g. "train[2]"
	Addr           string // "host:port" offered as MASTER_ADDR:MASTER_PORT if node rank 0
	LocalWorldSize int    // processes this member runs
}

// Round is a complete round as this member sees it.
type Round struct {
	Number     int      // generation, 1-based
	Restarts   int      // restarts consumed before this round
	Members    []Member // ordered by node rank
	NodeRank   int      // this member's index in Members
	WorldSize  int      // sum of LocalWorldSize
	RankOffset int      // global rank of this member's local rank 0
	Master     Member   // Members[0]
}

// Failure says who ended a round and why.
type Failure struct {
	Member   string
	Reason   string
	ExitCode int
}

func (f Failure) String() string {
	if f.ExitCode != 0 {
		return fmt.Sprintf("%s: %s (exit code %d)", f.Member, f.Reason, f.ExitCode)
	}
	return fmt.Sprintf("%s: %s", f.Member, f.Reason)
}

// Rendezvous is one member's handle on a run: the facade over a Session
// (session.go), the coordinator election (election.go), the coordinator
// (coordinator.go, deciding through the pure decide.go) and membership
// (join.go). Its methods are safe for concurrent use.
type Rendezvous struct {
	cfg  Config
	self Member
	kv   *api.KV
	base string // Prefix/RunID/

	mu       sync.Mutex
	sess     *consul.Session // current session; nil before Open and while a lost one is replaced
	snap     snapshot
	haveSnap bool
	changed  chan struct{} // closed and replaced on every publish
	fatal    error         // a corrupt record: waiting cannot fix it
	// registered is the generation of our live key and regSession the
	// session that holds it; a new session means registering again.
	registered int
	regSession string
	// former are the sessions this member replaced after Consul said they
	// were gone; one may still hold our keys (see heldByFormerSession).
	former []string
	// lastReturned is the number of the last round Join returned and
	// roundSession the session it was joined with: Watch reports that
	// session's loss as this member's failure.
	lastReturned int
	roundSession *consul.Session
	// rosterCache is the last roster snapRoster decoded.
	rosterCache decodedRoster
	// campaignSpread is campaignSpread (election.go); tests replace it.
	campaignSpread func(members int) time.Duration
	closedCh       chan struct{} // closed by Close
	opened         bool
	closed         bool
	stopping       bool // Stop: the run ends with this member if it is the last

	cancel context.CancelFunc // stops the background work; nil until Open succeeds
	wg     sync.WaitGroup
}

// decodedRoster is a roster as decodeRoster returned it, with the
// ModifyIndex of the key it was read from.
type decodedRoster struct {
	index   uint64
	number  int
	members []Member
}

// New validates the configuration and fills in defaults. It does no I/O.
func New(cfg Config, self Member) (*Rendezvous, error) {
	if cfg.Client == nil {
		return nil, errors.New("rendezvous: Config.Client is nil")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	cfg.Prefix = strings.Trim(cfg.Prefix, "/")
	if !cleanKeyPath(cfg.RunID) {
		return nil, fmt.Errorf("rendezvous: Config.RunID %q must be '/'-separated segments, none empty, \".\" or \"..\"", cfg.RunID)
	}
	if cfg.RunGroup != "" {
		sub, ok := strings.CutPrefix(cfg.RunID, cfg.RunGroup+"/")
		if !ok || sub == "" || strings.Contains(sub, "/") || isLayoutName(sub) {
			return nil, fmt.Errorf("rendezvous: Config.RunID %q must be Config.RunGroup %q + \"/\" + one path element (not ctl, m or roster)", cfg.RunID, cfg.RunGroup)
		}
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	// Consul refuses TTLs outside [10s, 24h] with its default settings;
	// an agent with a lower session_ttl_min accepts down to 1s.
	if cfg.SessionTTL < time.Second || cfg.SessionTTL > 24*time.Hour {
		return nil, fmt.Errorf("rendezvous: Config.SessionTTL %s out of range [1s, 24h]", cfg.SessionTTL)
	}
	if cfg.Min < 1 || cfg.Max < cfg.Min {
		return nil, fmt.Errorf("rendezvous: Config.Min %d / Max %d: need 1 <= Min <= Max", cfg.Min, cfg.Max)
	}
	if cfg.JoinTimeout == 0 {
		cfg.JoinTimeout = DefaultJoinTimeout
	}
	if cfg.JoinTimeout < 0 {
		return nil, fmt.Errorf("rendezvous: Config.JoinTimeout %s is negative", cfg.JoinTimeout)
	}
	if cfg.LastCall == 0 {
		cfg.LastCall = DefaultLastCall
	}
	if cfg.LastCall < 0 {
		return nil, fmt.Errorf("rendezvous: Config.LastCall %s is negative", cfg.LastCall)
	}
	if cfg.MaxRestarts < 0 {
		return nil, fmt.Errorf("rendezvous: Config.MaxRestarts %d is negative", cfg.MaxRestarts)
	}
	if cfg.SessionTTLOnly && len(cfg.SessionNodeChecks) > 0 {
		return nil, errors.New("rendezvous: Config.SessionTTLOnly and Config.SessionNodeChecks exclude each other")
	}
	if !cleanKeyPath(self.ID) || strings.ContainsAny(self.ID, "/ ") {
		return nil, fmt.Errorf("rendezvous: Member.ID %q must be non-empty, not \".\" or \"..\", without '/' or spaces", self.ID)
	}
	if self.Name == "" {
		self.Name = self.ID
	}
	// Tabs and newlines separate the fields of the roster.
	if strings.ContainsAny(self.Name+self.Addr, "\t\n") {
		return nil, fmt.Errorf("rendezvous: Member.Name %q / Addr %q must not contain tabs or newlines", self.Name, self.Addr)
	}
	if self.LocalWorldSize < 1 {
		return nil, fmt.Errorf("rendezvous: Member.LocalWorldSize %d must be at least 1", self.LocalWorldSize)
	}
	// What the other members will accept from us (records.go): a member
	// they would refuse would fail the whole run at its first roster.
	if err := checkMember(self); err != nil {
		return nil, fmt.Errorf("rendezvous: Member: %w", err)
	}
	if cfg.Max > MaxMembers {
		return nil, fmt.Errorf("rendezvous: Config.Max %d above the limit of %d members", cfg.Max, MaxMembers)
	}
	cfg.Expected = append([]string(nil), cfg.Expected...)
	cfg.SessionNodeChecks = append([]string(nil), cfg.SessionNodeChecks...)
	return &Rendezvous{
		cfg:      cfg,
		self:     self,
		kv:       cfg.Client.KV(),
		base:     cfg.Prefix + "/" + cfg.RunID + "/",
		changed:  make(chan struct{}),
		closedCh: make(chan struct{}),

		campaignSpread: campaignSpread,
	}, nil
}

func (r *Rendezvous) key(rel string) string { return r.base + rel }

// cleanKeyPath reports whether p can go into keys as it is: the Consul
// client puts a key into the URL path (escaping '%', '?' and '#'), and the
// agent's HTTP router cleans "." and ".." segments and empty ones away —
// a redirect to another key, then a 404 — so none may occur.
func cleanKeyPath(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

func (r *Rendezvous) logf(format string, args ...any) {
	if r.cfg.Logf != nil {
		r.cfg.Logf("rendezvous %s (%s): "+format, append([]any{r.cfg.RunID, r.self.Name}, args...)...)
	}
}

// SessionID returns this member's current Consul session ("" before Open,
// and while a lost session is being replaced).
func (r *Rendezvous) SessionID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sess == nil {
		return ""
	}
	return r.sess.ID()
}

func (r *Rendezvous) sessionOptions() consul.SessionOptions {
	var checks []string
	if len(r.cfg.SessionNodeChecks) > 0 {
		checks = r.cfg.SessionNodeChecks
	}
	return consul.SessionOptions{
		Name:       "gpujob-rendezvous " + r.cfg.RunID + " " + r.self.Name,
		TTL:        r.cfg.SessionTTL,
		Behavior:   api.SessionBehaviorDelete, // a lost member's keys go with it
		LockDelay:  lockDelay,
		NodeChecks: checks,
		TTLOnly:    r.cfg.SessionTTLOnly,
		Logf:       r.cfg.Logf,
	}
}

// Open creates the member's session (retrying transient Consul errors for
// up to JoinTimeout or until ctx ends), deletes the dead runs of its
// RunGroup, and starts the background work: session renewal and
// replacement, the watch of the run's control keys, and the campaign for
// the coordinator lock. If Open fails, Close is still safe to call.
func (r *Rendezvous) Open(ctx context.Context) error {
	r.mu.Lock()
	if r.opened {
		r.mu.Unlock()
		return errors.New("rendezvous: Open called twice")
	}
	r.opened = true
	r.mu.Unlock()

	octx, cancel := context.WithTimeout(ctx, r.cfg.JoinTimeout)
	defer cancel()
	sess, err := consul.NewSession(octx, r.cfg.Client, r.sessionOptions())
	if err != nil {
		return fmt.Errorf("rendezvous %s: open as %s: %w", r.cfg.RunID, r.self.Name, err)
	}
	bg, stopBg := context.WithCancel(context.Background())
	r.mu.Lock()
	if r.closed {
		// Closed while we were creating the session.
		r.mu.Unlock()
		stopBg()
		_ = sess.Close(ctx)
		return errNotOpen
	}
	r.sess = sess
	r.cancel = stopBg
	r.mu.Unlock()

	if r.cfg.RunGroup != "" {
		// Garbage collection: not worth failing the member for.
		if err := r.collectDeadRuns(octx); err != nil {
			r.logf("deleting dead runs of %s: %v", r.cfg.RunGroup, err)
		}
	}
	r.wg.Add(3)
	go func() { defer r.wg.Done(); r.keepSession(bg) }()
	go func() { defer r.wg.Done(); r.watchControl(bg) }()
	go func() { defer r.wg.Done(); r.campaign(bg) }()
	return nil
}

// keepSession replaces the member's session whenever Consul says it is
// gone. The coordinator will have ended the round (our registration went
// with the session); Watch reports the loss; a later Join registers with
// the new session.
func (r *Rendezvous) keepSession(ctx context.Context) {
	for {
		r.mu.Lock()
		sess := r.sess
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
		}
		if ctx.Err() != nil {
			return
		}
		r.logf("%v; creating a new session", sess.Err())
		r.mu.Lock()
		r.former = append(r.former, sess.ID())
		r.sess = nil
		r.publishLocked()
		r.mu.Unlock()
		var next *consul.Session
		for bo := newBackoff(); ; {
			var err error
			if next, err = consul.NewSession(ctx, r.cfg.Client, r.sessionOptions()); err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			// Only a permanent error gets here (ACLs, say): keep trying,
			// an operator may fix it.
			r.logf("%v (retrying)", err)
			if !bo.Wait(ctx) {
				return
			}
		}
		r.mu.Lock()
		r.sess = next
		r.publishLocked()
		r.mu.Unlock()
	}
}

// memberState is what a member knows at one moment.
type memberState struct {
	snap    snapshot
	ok      bool            // snap has been read from Consul at least once
	changed chan struct{}   // closes on the next change of any of this
	sess    *consul.Session // nil while a lost session is being replaced
	fatal   error
}

func (r *Rendezvous) state() memberState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return memberState{snap: r.snap, ok: r.haveSnap, changed: r.changed, sess: r.sess, fatal: r.fatal}
}

func (r *Rendezvous) publishLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Rendezvous) publish(s snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snap = s
	r.haveSnap = true
	r.publishLocked()
}

func (r *Rendezvous) setFatal(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal == nil {
		r.fatal = err
		r.publishLocked()
	}
}

// readOptions are the options of every read the rendezvous decides on:
// consistent ones. A Consul server that has just restarted and won its
// election answers default-mode reads from its state store before it has
// applied its log again, so for a moment a round record that exists reads as
// absent — and Fail, seeing no round to fail, returned without writing (a CI
// run lost a failure that way: the other member's watch never fired).
// Consistent reads wait for the leader's barrier instead (hashicorp/consul
// #2644, fixed for consistent reads only in #3154); until then Consul answers
// "Not ready to serve consistent reads", which is retried like any outage
// error. The window is a few milliseconds of a replay, so no test hits it on
// purpose; TestEveryReadIsConsistent checks that no read can fall into it.
func (r *Rendezvous) readOptions(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx)
}

// watchControl long-polls P/ctl/ and publishes every change. It is the only
// request a non-coordinating member keeps outstanding.
func (r *Rendezvous) watchControl(ctx context.Context) {
	r.watchPrefix(ctx, ctlPrefix, func(pairs api.KVPairs) bool {
		s, err := parseControl(r.base, pairs)
		if err != nil {
			// A corrupt record is not something waiting fixes; surface it.
			r.setFatal(fmt.Errorf("rendezvous %s: %w", r.cfg.RunID, err))
			return false
		}
		r.publish(s)
		return true
	})
}

// watchPrefix long-polls the KV prefix rel with blocking queries and hands
// every answer to changed until ctx ends or changed returns false. Errors
// (an agent restarting, no leader) are retried with backoff, for ever.
func (r *Rendezvous) watchPrefix(ctx context.Context, rel string, changed func(api.KVPairs) bool) {
	var idx uint64
	bo := newBackoff()
	for ctx.Err() == nil {
		q := r.readOptions(ctx)
		q.WaitIndex, q.WaitTime = idx, blockWait
		pairs, meta, err := r.kv.List(r.key(rel), q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.logf("watch %s: %v (retrying)", rel, err)
			if !bo.Wait(ctx) {
				return
			}
			continue
		}
		bo.Reset()
		// Consul's rule for blocking queries: an index that goes
		// backwards (snapshot restore) means start over.
		if meta.LastIndex < idx {
			idx = 0
		} else {
			idx = meta.LastIndex
		}
		if !changed(pairs) {
			return
		}
	}
}
