package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The e2e tests run in lanes: every test that uses a cluster is a parallel
// test (t.Parallel), but at most one test per lane runs at a time, and a
// test has its cluster to itself while it runs, as when they ran one after
// another: a test may restart its cluster's agents, fill its GPUs or stop
// its Consul for a minute. There is a dev cluster per lane, and a test that
// asks for "the dev cluster" (needCluster) gets whichever is free; a
// shared cluster (the secure, Docker, two-client and 3-server-Consul ones)
// is one resource that its users take in turn. Most of an e2e test's time
// is waiting on agents, torch start-up and timeouts: one lane left the two
// cores of a CI machine half idle, and two lanes nearly halve the run.

// lanesEnv sets the number of lanes (GPUJOB_E2E_LANES=1 runs the tests one
// after another, on one dev cluster).
const lanesEnv = "GPUJOB_E2E_LANES"

// devLanePorts are each lane's dev cluster's port offset and first dynamic
// task port (clusterOptions.dynPorts): off every other cluster's ports and
// below the ephemeral range. Their count bounds the lanes.
var devLanePorts = []struct{ offset, dynPorts int }{{10000, 28000}, {11000, 31600}}

// defaultLanes is the lanes of a run without GPUJOB_E2E_LANES.
const defaultLanes = 2

// e2eLanes reads GPUJOB_E2E_LANES.
func e2eLanes() (int, error) {
	v := os.Getenv(lanesEnv)
	if v == "" {
		return defaultLanes, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > len(devLanePorts) {
		return 0, fmt.Errorf("%s must be a whole number from 1 to %d, got %q", lanesEnv, len(devLanePorts), v)
	}
	return n, nil
}

// devLaneOptions is lane i's dev cluster.
func devLaneOptions(i int) clusterOptions {
	o := devClusterOptions
	o.offset, o.dynPorts = devLanePorts[i].offset, devLanePorts[i].dynPorts
	return o
}

// devKey is lane i's dev cluster's resource.
func devKey(i int) string { return fmt.Sprintf("%s%d", devKeyPrefix, i) }

const devKeyPrefix = "dev cluster "

// scheduler hands out lanes and clusters to the tests, first come first
// served among those that can run: a test waiting for a busy cluster does
// not hold a lane, so the next test in line that can run takes it.
type scheduler struct {
	mu       sync.Mutex
	lanes    int                 // free lanes
	clusters map[string]*cluster // registered resources (nil: a shared cluster, started by its first user)
	busy     map[string]bool
	waiting  []*claimant
	held     map[string]*holding // top-level test → what it holds
}

// claimant is a test waiting in line.
type claimant struct {
	keys     []string // any one of them will do, in order of preference
	needLane bool     // its test's first claim
	// shared: it waits for a shared cluster, whose users run one after
	// another; they go before the dev-cluster tests, which any lane can
	// run, so that a shared cluster's chain of tests is not left to the
	// end of the run with one lane busy and the others idle.
	shared  bool
	granted chan string
}

// waitMarker starts the line a test logs when it gets its cluster, with
// how long it waited in line (JSON: waitRecord): go test counts the wait
// in the test's time, and scripts/testtimes takes it out again.
const waitMarker = "gpujob-e2e-wait:"

// waitRecord is what follows waitMarker.
type waitRecord struct {
	Cluster string  `json:"cluster"`
	WaitedS float64 `json:"waited_s"`
}

// holding is what a running test holds.
type holding struct {
	lane bool
	keys []string
}

func newScheduler(lanes int) *scheduler {
	return &scheduler{lanes: lanes, clusters: map[string]*cluster{}, busy: map[string]bool{},
		held: map[string]*holding{}}
}

// add registers a resource (once; a later add of the same key does
// nothing); a dev cluster is added when it is up, and the tests waiting for
// one may take it.
func (s *scheduler) add(key string, c *cluster) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.clusters[key]; ok {
		return
	}
	s.clusters[key] = c
	s.dispatchLocked()
}

// claim makes t a parallel test and blocks until it may run on one of keys
// and, at its first claim, has a lane; it returns the key it got and the
// cluster registered with it. Both are given back when the test ends, after
// the cleanups it registers later. A test may claim a second cluster
// (TestListenersStayOnLoopback uses two): that waits for the cluster only,
// as the test has its lane. Claims come from top-level tests: a subtest's
// end is not the end of its test's use of a cluster.
func (s *scheduler) claim(t *testing.T, keys ...string) (string, *cluster) {
	t.Helper()
	name := t.Name()
	if strings.Contains(name, "/") {
		t.Fatalf("%s asks for a cluster from a subtest: ask in the top-level test, whose end gives it back", name)
	}
	s.mu.Lock()
	h := s.held[name]
	s.mu.Unlock()
	if h == nil {
		// Paused until the serial tests (those without a cluster) are done,
		// and then run as go test's -parallel allows: TestMain raises it so
		// that the lanes, not -parallel, bound the tests that run.
		t.Parallel()
		t.Cleanup(func() { s.release(name) })
	}
	w := &claimant{keys: keys, needLane: h == nil, shared: !strings.HasPrefix(keys[0], devKeyPrefix),
		granted: make(chan string, 1)}
	start := time.Now()
	s.mu.Lock()
	s.waiting = append(s.waiting, w)
	s.dispatchLocked()
	s.mu.Unlock()
	select {
	case key := <-w.granted:
		rec, _ := json.Marshal(waitRecord{Cluster: key, WaitedS: time.Since(start).Seconds()})
		t.Logf("%s %s", waitMarker, rec)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.held[name] == nil {
			s.held[name] = &holding{}
		}
		s.held[name].lane = s.held[name].lane || w.needLane
		s.held[name].keys = append(s.held[name].keys, key)
		return key, s.clusters[key]
	case <-running.ctx.Done():
		s.mu.Lock()
		s.dropLocked(w)
		s.mu.Unlock()
		t.Fatalf("the run is being torn down (%s) before %s got a cluster", running.closedReason(), name)
		return "", nil
	}
}

// release gives back what test name holds.
func (s *scheduler) release(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held[name]
	if h == nil {
		return
	}
	delete(s.held, name)
	for _, k := range h.keys {
		delete(s.busy, k)
	}
	if h.lane {
		s.lanes++
	}
	s.dispatchLocked()
}

// dispatchLocked grants every waiting claim that can run now: the claims
// for shared clusters first, then the others, each in order of arrival.
func (s *scheduler) dispatchLocked() {
	s.grantLocked(func(w *claimant) bool { return w.shared })
	s.grantLocked(func(w *claimant) bool { return !w.shared })
}

// grantLocked grants, in order of arrival, the waiting claims of which
// grants what it can.
func (s *scheduler) grantLocked(which func(*claimant) bool) {
	kept := s.waiting[:0]
	for _, w := range s.waiting {
		if !which(w) {
			kept = append(kept, w)
			continue
		}
		key := ""
		if !w.needLane || s.lanes > 0 {
			for _, k := range w.keys {
				if _, ok := s.clusters[k]; ok && !s.busy[k] {
					key = k
					break
				}
			}
		}
		if key == "" {
			kept = append(kept, w)
			continue
		}
		s.busy[key] = true
		if w.needLane {
			s.lanes--
		}
		w.granted <- key
	}
	clear(s.waiting[len(kept):])
	s.waiting = kept
}

// dropLocked takes w out of the line, or gives back what it was granted
// while it was leaving.
func (s *scheduler) dropLocked(w *claimant) {
	for i, x := range s.waiting {
		if x == w {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			return
		}
	}
	select {
	case key := <-w.granted:
		delete(s.busy, key)
		if w.needLane {
			s.lanes++
		}
		s.dispatchLocked()
	default:
	}
}

// e2eUsers are the Unix users of the tests' tenants (ensureTenants) and of
// the clusters' own jobs with ACLs or TLS (scripts/dev-up.sh makes them too,
// when they are missing).
var e2eUsers = []string{tenantAUser, tenantBUser, "gpujob-sweep", "gpujob-exporter", "gpujob-gateway", "gpujob-queue"}

// makeUsers makes the users that do not exist, as root; not as root it does
// nothing (the tests that need them need root and say so).
func makeUsers(names []string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	for _, u := range names {
		if _, err := user.Lookup(u); err == nil {
			continue
		}
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
			"--shell", "/usr/sbin/nologin", u).CombinedOutput(); err != nil {
			return fmt.Errorf("useradd %s: %v\n%s", u, err, out)
		}
	}
	return nil
}
