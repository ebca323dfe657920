package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
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
	// errorBackoff is how long a background loop waits after a failed
	// request before retrying (an error path, not polling).
	errorBackoff = 500 * time.Millisecond
)

// Config describes a run and how this member takes part in it.
type Config struct {
	Client      *api.Client   // Consul client
	Prefix      string        // KV prefix, default "gpujob/rendezvous"
	RunID       string        // job-scoped id, e.g. "default/bert-a"; keys live under Prefix/RunID/
	RunGroup    string        // placeholder until the rendezvous rework lands (issue 7): runs of one job
	SessionTTL  time.Duration // default 10s; renewed by the member
	Min, Max    int           // nnodes "4" => 4,4 ; "2:4" => 2,4
	JoinTimeout time.Duration // default 5m: how long Join waits for a round to complete
	LastCall    time.Duration // with Min<Max: once Min members joined, wait this long for more (default 5s)
	MaxRestarts int           // group-wide restart budget
	Expected    []string      // names of the members that should join, for error messages
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

// Rendezvous is one member's handle on a run. Its methods are safe for
// concurrent use.
type Rendezvous struct {
	cfg  Config
	self Member
	kv   *api.KV
	ses  *api.Session
	base string // Prefix/RunID/

	mu           sync.Mutex
	sessionID    string
	snap         snapshot
	haveSnap     bool
	changed      chan struct{} // closed and replaced on every publish
	lost         error         // set when our session is gone for good
	registered   int           // generation of our live key; 0 = never registered
	lastReturned int           // number of the last round Join returned
	closedCh     chan struct{} // closed by Close
	leading      bool
	opened       bool
	closed       bool
	stopping     bool // Stop: the run ends with this member if it is the last

	tr        []time.Time
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	renewStop chan struct{}
	renewDone chan struct{}
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
	if cfg.RunID == "" || strings.HasPrefix(cfg.RunID, "/") || strings.HasSuffix(cfg.RunID, "/") {
		return nil, fmt.Errorf("rendezvous: Config.RunID %q must be non-empty without leading or trailing '/'", cfg.RunID)
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
	if self.ID == "" || strings.ContainsAny(self.ID, "/ ") {
		return nil, fmt.Errorf("rendezvous: Member.ID %q must be non-empty without '/' or spaces", self.ID)
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
	cfg.Expected = append([]string(nil), cfg.Expected...)
	return &Rendezvous{
		cfg:      cfg,
		self:     self,
		kv:       cfg.Client.KV(),
		ses:      cfg.Client.Session(),
		base:     cfg.Prefix + "/" + cfg.RunID + "/",
		changed:  make(chan struct{}),
		closedCh: make(chan struct{}),
	}, nil
}

func (r *Rendezvous) key(rel string) string { return r.base + rel }

// SessionID returns this member's Consul session ("" before Open).
func (r *Rendezvous) SessionID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sessionID
}

// Open creates the member's session and starts renewing it and watching the
// run's control keys. The session uses Behavior=delete, so the member's
// registration disappears with it, and the default node check (serfHealth),
// so a node that Consul declares failed invalidates it.
func (r *Rendezvous) Open(ctx context.Context) error {
	r.mu.Lock()
	if r.opened {
		r.mu.Unlock()
		return errors.New("rendezvous: Open called twice")
	}
	r.opened = true
	r.mu.Unlock()

	ttl := r.cfg.SessionTTL.String()
	id, _, err := r.ses.Create(&api.SessionEntry{
		Name:      "gpujob-rendezvous " + r.cfg.RunID + " " + r.self.Name,
		Behavior:  api.SessionBehaviorDelete,
		TTL:       ttl,
		LockDelay: lockDelay,
	}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("rendezvous %s: create session for %s: %w", r.cfg.RunID, r.self.Name, err)
	}
	bg, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	r.sessionID = id
	r.cancel = cancel
	r.renewStop = make(chan struct{})
	r.renewDone = make(chan struct{})
	r.mu.Unlock()

	go func() {
		defer close(r.renewDone)
		// RenewPeriodic renews at TTL/2 and destroys the session when
		// renewStop closes; it returns early when the session is gone.
		err := r.ses.RenewPeriodic(ttl, id, (&api.WriteOptions{}).WithContext(bg), r.renewStop)
		if err != nil && bg.Err() == nil {
			r.setLost(fmt.Errorf("session %s of %s lost: %w", id, r.self.Name, err))
		}
	}()
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.watchControl(bg) }()
	go func() { defer r.wg.Done(); r.campaign(bg) }()
	return nil
}

func (r *Rendezvous) setLost(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost == nil {
		r.lost = err
		close(r.changed)
		r.changed = make(chan struct{})
	}
}

// state returns the latest published snapshot, whether there is one yet, the
// channel that closes on the next change, and the session-lost error if any.
func (r *Rendezvous) state() (snapshot, bool, <-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snap, r.haveSnap, r.changed, r.lost
}

func (r *Rendezvous) publish(s snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snap = s
	r.haveSnap = true
	close(r.changed)
	r.changed = make(chan struct{})
}

// watchControl long-polls P/ctl/ and publishes every change. It is the only
// request a non-coordinating member keeps outstanding.
func (r *Rendezvous) watchControl(ctx context.Context) {
	r.watchPrefix(ctx, ctlPrefix, func(pairs api.KVPairs) bool {
		s, err := parseControl(r.base, pairs)
		if err != nil {
			// A corrupt record is not something waiting fixes; surface it.
			r.setLost(fmt.Errorf("rendezvous %s: %w", r.cfg.RunID, err))
			return false
		}
		r.publish(s)
		return true
	})
}

// watchPrefix long-polls the KV prefix rel with blocking queries and hands
// every answer to changed until ctx ends or changed returns false.
func (r *Rendezvous) watchPrefix(ctx context.Context, rel string, changed func(api.KVPairs) bool) {
	var idx uint64
	for ctx.Err() == nil {
		pairs, meta, err := r.kv.List(r.key(rel), (&api.QueryOptions{WaitIndex: idx, WaitTime: blockWait}).WithContext(ctx))
		if err != nil {
			if !sleepCtx(ctx, errorBackoff) {
				return
			}
			continue
		}
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

// campaign acquires the coordinator lock whenever it is free and runs the
// coordinator while this member holds it.
func (r *Rendezvous) campaign(ctx context.Context) {
	for ctx.Err() == nil {
		s, ok, changed, lost := r.state()
		if lost != nil {
			return
		}
		if !ok || s.leader != "" {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			continue
		}
		got, _, err := r.kv.Acquire(&api.KVPair{Key: r.key(leaderKey), Value: []byte(r.self.ID), Session: r.sessionID}, (&api.WriteOptions{}).WithContext(ctx))
		if err != nil || !got {
			// Lost the race (the watch will show the winner), or the
			// lock-delay of a dead holder is still running: then
			// nothing changes in Consul, so retry after a short wait.
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-time.After(lockDelay + 50*time.Millisecond):
			}
			continue
		}
		lctx, cancel := context.WithCancel(ctx)
		r.mu.Lock()
		r.leading = true
		r.mu.Unlock()
		done := make(chan struct{})
		go func() { defer close(done); r.coordinate(lctx) }()
		// Lead until the published lock holder is someone else or nobody
		// (our session died, or the key was deleted). Until the watch
		// has shown our own hold, an empty holder is just a stale view.
		confirmed := false
		for {
			s, ok, changed, lost := r.state()
			if lost != nil {
				break
			}
			if ok && s.leader == r.sessionID {
				confirmed = true
			} else if ok && (confirmed || s.leader != "") {
				break
			}
			select {
			case <-ctx.Done():
			case <-changed:
				continue
			}
			break
		}
		cancel()
		<-done
		r.mu.Lock()
		r.leading = false
		r.mu.Unlock()
	}
}

// sleepCtx waits d unless ctx ends first; it reports whether ctx is alive.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
