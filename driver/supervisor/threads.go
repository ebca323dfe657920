package supervisor

import (
	"runtime"
	"sync"
)

// reserveThreads makes the Go runtime start n more OS threads now and keep
// them idle for later, so that the supervisor needs no new thread while its
// ranks run.
//
// Under pids_limit the supervisor shares its task's allowance of processes
// and threads with the ranks: a rank that starts processes until the limit
// leaves none, and a Go program that cannot create a thread when a
// goroutine blocks in a system call dies ("failed to create new OS
// thread", exit 2). Seen in CI as the fork-bomb test's supervisor dying
// with the rank's report unwritten. The runtime never ends an idle thread
// (only one whose goroutine exits while locked to it), so threads started
// here serve every later hand-off of a blocked goroutine's processor.
//
// Each goroutine locks itself to a thread and waits until all have: n
// goroutines each holding a thread at once is what forces n threads. They
// then unlock and return, leaving their threads idle.
func reserveThreads(n int) {
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	done.Wait()
}

// reservedThreads is how many threads the supervisor reserves for nproc
// ranks under a limit of max processes and threads: two per rank (each
// rank's wait blocks one) and room for the rest of what it does at once
// (signals, Consul, logs, the stop), but never more than a quarter of the
// limit, which is the ranks' too.
func reservedThreads(nproc, max int) int { return min(16+2*nproc, max/4) }
