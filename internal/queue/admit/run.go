package admit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// sessionLockDelay is the leader session's lock-delay: every write checks
// the session in its transaction, so a deposed leader's late write cannot
// land, and the next leader need not wait.
const sessionLockDelay = time.Millisecond

// Run campaigns for leadership and, while it leads, reconciles whenever
// the queue configuration or the queued jobs change in Consul (blocking
// queries, internal/consul's Watch), whenever Nomad's allocations change
// (Nomad's blocking queries), and every Resync at the latest. A lost term
// campaigns again; Run returns when ctx ends (resigning, so that another
// controller leads at once) or when its session is lost.
func (c *Controller) Run(ctx context.Context) error {
	ttl := c.SessionTTL
	if ttl == 0 {
		ttl = 10 * time.Second
	}
	sess, err := consul.NewSession(ctx, c.Consul, consul.SessionOptions{
		Name: "gpujob admission controller " + c.ID, TTL: ttl, LockDelay: sessionLockDelay, TTLOnly: true, Logf: c.Logf,
	})
	if err != nil {
		return fmt.Errorf("admission controller: session: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = sess.Close(cctx)
	}()
	if err := c.endStaleLead(ctx, sess.ID()); err != nil {
		return fmt.Errorf("admission controller: %w", err)
	}
	el := consul.NewElection(sess, c.leaderKey(), consul.MutexOptions{LockDelay: time.Second, Logf: c.Logf})
	for {
		if err := el.Campaign(ctx, []byte(c.ID)); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("admission controller: %w", err)
		}
		c.logf("admission controller %s: leading", c.ID)
		c.lead(sess.ID(), el.Lost())
		c.leadTerm(ctx, el.Lost())
		c.lead("", nil)
		if ctx.Err() != nil {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = el.Resign(rctx)
			cancel()
			return nil
		}
		if err := sess.Err(); err != nil {
			return fmt.Errorf("admission controller: %w", err)
		}
		c.logf("admission controller %s: lost leadership; campaigning again", c.ID)
	}
}

// leadTerm reconciles until lost closes or ctx ends.
func (c *Controller) leadTerm(ctx context.Context, lost <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	wg.Add(3)
	go func() {
		defer wg.Done()
		_ = queuekv.New(c.Consul, c.prefix()).Watch(ctx, consul.WatchOptions{Logf: c.Logf, What: "watching the queue configuration"},
			func(*queuekv.Record, uint64, error) error { notify(); return nil })
	}()
	go func() {
		defer wg.Done()
		_ = consul.Watch(ctx, consul.PrefixQuery(c.Consul, c.jobsPrefix()+"/"), consul.WatchOptions{Logf: c.Logf, What: "watching the queued jobs"},
			func(api.KVPairs, uint64) error { notify(); return nil })
	}()
	go func() {
		defer wg.Done()
		c.watchAllocations(ctx, notify)
	}()
	resync := c.Resync
	if resync <= 0 {
		resync = 30 * time.Second
	}
	bo := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		wait := resync
		if _, err := c.Reconcile(ctx); err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrNotLeader) || errors.Is(err, errLeadershipLost) {
				return
			}
			c.logf("admission controller: %v (reconciling again)", err)
			wait = bo.Next()
		} else {
			bo.Reset()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-lost:
		case <-changed:
		case <-t.C:
		}
		t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-lost:
			return
		default:
		}
	}
}

// watchAllocations notifies whenever Nomad's allocations may have changed,
// with Nomad's blocking queries; failures are retried with backoff.
func (c *Controller) watchAllocations(ctx context.Context, notify func()) {
	bo := backoff.New(100*time.Millisecond, 5*time.Second)
	var index uint64
	for {
		next, err := c.Nomad.WaitAllocations(ctx, index)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.logf("admission controller: watching Nomad's allocations: %v (retrying)", err)
			if !bo.Wait(ctx) {
				return
			}
			continue
		}
		bo.Reset()
		if next != index {
			index = next
			notify()
		}
	}
}

// endStaleLead ends the session that holds the leader key under this
// controller's own ID, if any: an earlier run of this very controller (its
// task restarted in the same Nomad allocation after a crash, kill -9 or an
// OOM kill, so it never resigned). Nomad starts a task again only once its
// process has exited, so that session has no live holder; left alone it
// would keep the queue leaderless until its TTL ran out. A session under
// any other ID is another controller's, which may be alive: never touched.
func (c *Controller) endStaleLead(ctx context.Context, own string) error {
	pair, _, err := c.Consul.KV().Get(c.leaderKey(), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("reading %s: %w", c.leaderKey(), err)
	}
	if pair == nil || pair.Session == "" || pair.Session == own || string(pair.Value) != c.ID {
		return nil
	}
	if _, err := c.Consul.Session().Destroy(pair.Session, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("ending session %s, which an earlier run of controller %s left holding %s: %w", pair.Session, c.ID, c.leaderKey(), err)
	}
	c.logf("admission controller %s: ended session %s, which an earlier run of this controller left holding the lead", c.ID, pair.Session)
	return nil
}
