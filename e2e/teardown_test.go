package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clusterSet is every dev cluster this run started, so that whatever ends
// the run (its last test, a signal, the -timeout deadline) can stop them
// all, and then check that none of their processes survived.
type clusterSet struct {
	// ctx ends when the run is torn down: a dev-up still starting a
	// cluster then is stopped (it holds mu meanwhile).
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	clusters []*cluster
	stopped  map[*cluster]bool
	// closed: the run is being torn down; no cluster starts any more and
	// the tests that still run fail at once instead of timing out against
	// stopped agents.
	closed string
}

// running is the package's set: TestMain and the shared clusters use it.
var running = newClusterSet()

func newClusterSet() *clusterSet {
	ctx, cancel := context.WithCancel(context.Background())
	return &clusterSet{ctx: ctx, cancel: cancel, stopped: map[*cluster]bool{}}
}

// start starts a cluster as opts say and keeps it in the set; once the set
// is closed it returns a cluster that failed with the reason.
func (s *clusterSet) start(opts clusterOptions) *cluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed != "" {
		return &cluster{opts: opts, failed: s.closed}
	}
	c := startClusterOpts(s.ctx, opts)
	s.clusters = append(s.clusters, c)
	return c
}

// closedReason says why the run is being torn down, "" while it is not.
func (s *clusterSet) closedReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// stop stops one cluster of the set (a shared cluster after its last test),
// once.
func (s *clusterSet) stop(c *cluster) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(c)
}

func (s *clusterSet) stopLocked(c *cluster) error {
	if s.stopped[c] {
		return nil
	}
	s.stopped[c] = true
	start := time.Now()
	err := c.stop()
	if c.dir != "" {
		fmt.Printf("e2e: stopped the cluster in %s in %s\n", c.dir, time.Since(start).Round(time.Millisecond))
	}
	return err
}

// stopAll closes the set for the reason why, stops every cluster still up
// and then looks for processes of theirs that outlived the stop: agents,
// plugins, supervisors, ranks. Survivors are killed and are an error.
func (s *clusterSet) stopAll(why string) error {
	s.cancel() // first: a cluster that is starting holds mu
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed == "" {
		s.closed = why
	}
	var errs []error
	var dirs []string
	for _, c := range s.clusters {
		if c.dir != "" {
			dirs = append(dirs, filepath.Dir(c.dir))
		}
		if err := s.stopLocked(c); err != nil {
			errs = append(errs, fmt.Errorf("stopping the cluster in %s: %w", c.dir, err))
		}
	}
	if left := survivors(dirs); len(left) > 0 {
		var names []string
		for _, p := range left {
			names = append(names, p.String())
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		errs = append(errs, fmt.Errorf("processes of the dev clusters outlived their stop (killed now): %s",
			strings.Join(names, "; ")))
	}
	return errors.Join(errs...)
}

// survivors lists the live processes that belong to a cluster whose state
// lived under one of dirs: the agents name their config and data there on
// their command line, and everything a client started (executors, logmons,
// plugins, supervisors, ranks) works in a directory under it.
func survivors(dirs []string) []proc {
	if len(dirs) == 0 {
		return nil
	}
	under := func(s string) bool {
		for _, d := range dirs {
			if s == d || strings.Contains(s, d+"/") {
				return true
			}
		}
		return false
	}
	self := os.Getpid()
	paths, _ := filepath.Glob("/proc/[0-9]*")
	var out []proc
	for _, d := range paths {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		cwd, _ := os.Readlink(filepath.Join(d, "cwd"))
		if !under(string(cmdline)) && !under(cwd+"/") {
			continue
		}
		if _, zombie := procStat(pid); zombie {
			continue
		}
		out = append(out, proc{pid: pid, args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")})
	}
	return out
}

// teardownMargin is how long before go test's -timeout (timeout) the
// clusters are stopped: enough to stop five clusters, and a tenth of a
// short timeout, which leaves the tests most of it.
func teardownMargin(timeout time.Duration) time.Duration { return min(timeout/10, 2*time.Minute) }

// watchForTeardown stops every cluster of running when the run is
// interrupted (SIGINT, SIGTERM) or margin before go test's timeout (0:
// none; its -timeout, read by TestMain), whose panic would end the process
// without running any cleanup: the agents, their tasks and dockerd would
// outlive the run, holding ports and memory. At the deadline the run goes
// on to its timeout, whose report names the test that hung; the tests
// still running fail fast against stopped clusters. The returned func
// stops watching. The margin is a parameter so that a test can exercise
// this path with a timeout of seconds (TestTeardownBeforeTimeout).
func watchForTeardown(timeout, margin time.Duration) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	// No -timeout: a timer that never fires.
	deadline := time.NewTimer(time.Duration(math.MaxInt64))
	if timeout > 0 {
		deadline.Reset(timeout - margin)
	}
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			fmt.Fprintf(os.Stderr, "e2e: %v: stopping the dev clusters\n", sig)
			if err := running.stopAll(fmt.Sprintf("the run was interrupted (%v)", sig)); err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
			}
			os.Exit(1)
		case <-deadline.C:
			fmt.Fprintln(os.Stderr, "e2e: the -timeout deadline is near: stopping the dev clusters")
			if err := running.stopAll("the run's -timeout deadline is near; the clusters are stopped"); err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
			} else {
				// Said, so that a log that ends in the timeout's panic
				// shows the clusters did not outlive the run.
				fmt.Fprintln(os.Stderr, "e2e: the dev clusters are stopped; the run goes on to its -timeout")
			}
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sigs)
		deadline.Stop()
		close(done)
	}
}

// testTimeout is go test's -timeout for this run (0: none).
func testTimeout() time.Duration {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	d, _ := f.Value.(flag.Getter).Get().(time.Duration)
	return d
}

// selected says whether this run's -run and -skip select the top-level
// test name.
func selected(name string) bool {
	pattern := func(flagName string) string {
		if f := flag.Lookup(flagName); f != nil {
			return f.Value.String()
		}
		return ""
	}
	return selectedBy(pattern("test.run"), pattern("test.skip"), name)
}

// selectedBy says whether -run run and -skip skip select the top-level test
// name. It reads only the patterns' first level (before a "/"), which is
// what decides a top-level test; where it errs it errs towards "selected",
// which only keeps a shared cluster up until TestMain ends.
func selectedBy(run, skip, name string) bool {
	firstLevel := func(pattern string) (re *regexp.Regexp, nested bool) {
		if pattern == "" {
			return nil, false
		}
		first, rest, _ := strings.Cut(pattern, "/")
		re, err := regexp.Compile(first)
		if err != nil {
			return nil, false
		}
		return re, rest != ""
	}
	if re, _ := firstLevel(run); re != nil && !re.MatchString(name) {
		return false
	}
	// -skip 'A/B' skips A's subtests B, not A.
	if re, nested := firstLevel(skip); re != nil && !nested && re.MatchString(name) {
		return false
	}
	return true
}

// usersToRun is the tests of users that this run will run.
func usersToRun(users []string) map[string]bool {
	out := map[string]bool{}
	for _, u := range users {
		if selected(u) {
			out[u] = true
		}
	}
	return out
}

// isUser says whether name (a top-level test) is in users.
func isUser(users []string, name string) bool { return slices.Contains(users, name) }
