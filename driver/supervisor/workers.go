package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// exit is how one local worker ended.
type exit struct {
	LocalRank int
	Rank      int
	Code      int // 128+signal when killed by a signal, as a shell reports it
	Err       error
}

// workers are the local processes of one round. Each runs in its own process
// group so stopping it also stops what it spawned (DataLoader workers).
type workers struct {
	cmds   []*exec.Cmd
	groups []ProcessGroup
	exits  chan exit
	done   chan struct{} // closed when every process has been reaped
}

// spawner starts the ranks from one OS thread that it keeps locked. Ranks
// get SIGKILL as their parent-death signal, so a supervisor that dies (kill
// -9, OOM) takes them along; but Linux sends that signal when the *thread*
// that forked them exits, and Go ends a thread whenever a goroutine exits
// while locked to it. A thread held by this goroutine alone cannot be ended
// that way while the ranks it started live.
type spawner struct {
	requests chan spawnRequest
	stop     chan struct{}
	stopped  chan struct{}
}

type spawnRequest struct {
	cmd    *exec.Cmd
	result chan error
}

func newSpawner() *spawner {
	s := &spawner{requests: make(chan spawnRequest), stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(s.stopped)
		runtime.LockOSThread()
		// Unlocked, not left locked, on the way out: a goroutine that exits
		// locked takes its thread down with it.
		defer runtime.UnlockOSThread()
		for {
			select {
			case r := <-s.requests:
				r.result <- r.cmd.Start()
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

// start starts cmd from the spawner's thread.
func (s *spawner) start(cmd *exec.Cmd) error {
	r := spawnRequest{cmd: cmd, result: make(chan error, 1)}
	select {
	case s.requests <- r:
		return <-r.result
	case <-s.stopped:
		return errors.New("the supervisor is shutting down")
	}
}

// close releases the thread; call it only once no rank it started runs.
func (s *spawner) close() {
	close(s.stop)
	<-s.stopped
}

// startWorkers starts s.NProcPerNode processes for placement p through
// start (a spawner's).
func startWorkers(s *Spec, p Placement, base []string, stdout, stderr io.Writer, start func(*exec.Cmd) error) (*workers, error) {
	w := &workers{exits: make(chan exit, s.NProcPerNode), done: make(chan struct{})}
	var outMu, errMu sync.Mutex
	var wg sync.WaitGroup
	for local := 0; local < s.NProcPerNode; local++ {
		cmd := exec.Command(s.Command, s.Args...)
		cmd.Env = WorkerEnv(base, s, p, local)
		cmd.Dir = s.Workdir
		if cmd.Dir == "" {
			cmd.Dir, _ = os.Getwd()
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if s.LogPrefix {
			prefix := fmt.Sprintf("[rank %d] ", p.RankOffset+local)
			cmd.Stdout = &lineWriter{prefix: prefix, out: stdout, mu: &outMu}
			cmd.Stderr = &lineWriter{prefix: prefix, out: stderr, mu: &errMu}
		} else {
			cmd.Stdout, cmd.Stderr = stdout, stderr
		}
		// A worker's own children can hold its output pipe open after it
		// exits; do not let them keep the round from ending.
		cmd.WaitDelay = 2 * time.Second
		if err := start(cmd); err != nil {
			w.kill(syscall.SIGKILL)
			wg.Wait()
			return nil, fmt.Errorf("starting local rank %d (%s): %w", local, s.Command, err)
		}
		w.cmds = append(w.cmds, cmd)
		// Read before Wait can reap it: until then /proc/PID exists.
		ticks, _ := processStart(cmd.Process.Pid)
		w.groups = append(w.groups, ProcessGroup{PGID: cmd.Process.Pid, StartTicks: ticks})
		wg.Add(1)
		go func(local int, cmd *exec.Cmd) {
			defer wg.Done()
			err := cmd.Wait()
			if lw, ok := cmd.Stdout.(*lineWriter); ok {
				lw.flush()
				cmd.Stderr.(*lineWriter).flush()
			}
			w.exits <- exit{LocalRank: local, Rank: p.RankOffset + local, Code: exitCode(cmd, err), Err: waitErr(err)}
		}(local, cmd)
	}
	go func() { wg.Wait(); close(w.done) }()
	return w, nil
}

// exitCode is the process's exit status, 128+N for a signal N.
func exitCode(cmd *exec.Cmd, err error) int {
	if cmd.ProcessState == nil {
		return -1
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}

// waitErr keeps the errors that say the rank did not run to an exit status.
// Its own non-zero exit is in the code; and exec.ErrWaitDelay (a child it
// started still holds its output when it exits) says nothing about how the
// rank ended: its exit status decides.
func waitErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) || errors.Is(err, exec.ErrWaitDelay) {
		return nil
	}
	return err
}

// kill signals every started process group: for stopping, which must reach
// what the ranks spawned.
func (w *workers) kill(sig syscall.Signal) {
	for _, c := range w.cmds {
		if c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, sig)
		}
	}
}

// signal passes sig to each rank process only, not its group: a rank that
// wants its children told (DataLoader workers, which mostly do not handle
// HUP or USR1 and would die of it) does so itself.
func (w *workers) signal(sig syscall.Signal) {
	for _, c := range w.cmds {
		if c.Process != nil {
			_ = c.Process.Signal(sig)
		}
	}
}

// stop ends every process group: SIGTERM, then SIGKILL after grace, and
// waits until all are reaped so no worker outlives its round.
func (w *workers) stop(grace time.Duration) {
	w.kill(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
		w.kill(syscall.SIGKILL)
		<-w.done
	}
	// Children a worker left behind in its group get no grace.
	w.kill(syscall.SIGKILL)
}

// lineWriter prefixes each complete line with the rank, writing whole lines
// under a lock shared by the ranks so their output never interleaves
// mid-line.
type lineWriter struct {
	prefix string
	out    io.Writer
	mu     *sync.Mutex
	buf    []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	i := bytes.LastIndexByte(l.buf, '\n')
	if i < 0 {
		return len(p), nil
	}
	var b bytes.Buffer
	for _, line := range bytes.SplitAfter(l.buf[:i+1], []byte{'\n'}) {
		if len(line) > 0 {
			b.WriteString(l.prefix)
			b.Write(line)
		}
	}
	l.buf = append(l.buf[:0], l.buf[i+1:]...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.out.Write(b.Bytes()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// flush writes a last line that had no newline.
func (l *lineWriter) flush() {
	if len(l.buf) == 0 {
		return
	}
	_, _ = l.Write([]byte{'\n'})
}
