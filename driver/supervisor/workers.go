package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/internal/pylaunch"
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
	procs  []*rankProc
	groups []ProcessGroup
	exits  chan exit
	done   chan struct{} // closed when every process has been reaped
}

// rankProc is one started rank: a process the supervisor started (cmd) or
// one a zygote forked for it (a pidfd the supervisor took once it had
// checked the zygote's report, forkedRank; the zygote reaps it).
type rankProc struct {
	pid    int
	cmd    *exec.Cmd
	group  ProcessGroup // the rank's process group, which it leads
	reaped atomic.Bool

	mu    sync.Mutex
	pidfd int // a forked rank's, -1 once closed (or for a started rank)
}

// signal sends sig to the rank process alone: through the process the
// supervisor started, or the pidfd it holds, never a bare PID that may be
// another process's by now.
func (r *rankProc) signal(sig syscall.Signal) {
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(sig)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pidfd >= 0 {
		_ = signalPidfd(r.pidfd, sig)
	}
}

// closePidfd gives up a forked rank's pidfd once its end was reported.
func (r *rankProc) closePidfd() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pidfd >= 0 {
		_ = unix.Close(r.pidfd)
		r.pidfd = -1
	}
}

// killGroup signals the rank's process group while it is provably the
// rank's (ProcessGroup.ours): the rank, or what it left behind.
func (r *rankProc) killGroup(sig syscall.Signal) {
	if r.group.PGID > 1 && r.group.ours() {
		_ = syscall.Kill(-r.group.PGID, sig)
	}
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
	return startWorkersWith(s, p, base, stdout, stderr, start, nil, nil)
}

// startWorkersWith is startWorkers with preloaded interpreters: a slot whose
// zygote serves forks its rank from it, any other starts cold. tee, if set,
// may give a global rank a reader of its stdout (a sweep trial's rank 0,
// Supervisor.rankOutput), which sees the rank's own bytes, before any
// prefix, and is closed once the rank's output ends.
func startWorkersWith(s *Spec, p Placement, base []string, stdout, stderr io.Writer, start func(*exec.Cmd) error,
	pool *zygotes, tee func(rank int) io.WriteCloser) (*workers, error) {
	w := &workers{exits: make(chan exit, s.NProcPerNode), done: make(chan struct{})}
	var outMu, errMu sync.Mutex
	var wg sync.WaitGroup
	for local := 0; local < s.NProcPerNode; local++ {
		env := WorkerEnv(base, s, p, local)
		dir := s.Workdir
		if dir == "" {
			dir, _ = os.Getwd()
		}
		var rout, rerr io.Writer = stdout, stderr
		var flush func()
		if s.LogPrefix {
			prefix := fmt.Sprintf("[rank %d] ", p.RankOffset+local)
			lo := &lineWriter{prefix: prefix, out: stdout, mu: &outMu}
			le := &lineWriter{prefix: prefix, out: stderr, mu: &errMu}
			rout, rerr = lo, le
			flush = func() { lo.flush(); le.flush() }
		}
		if tee != nil {
			if t := tee(p.RankOffset + local); t != nil {
				rout = &teeWriter{out: rout, copy: t}
				prefixed := flush
				flush = func() {
					if prefixed != nil {
						prefixed()
					}
					_ = t.Close()
				}
			}
		}
		var z *zygote
		if pool != nil {
			z = pool.get(local)
		}
		var proc *rankProc
		var err error
		if z != nil {
			proc, err = forkRank(z, pool.launch, env, dir, rout, rerr, ranksUID(s), p.RankOffset+local, w.exits, flush, &wg)
		} else {
			proc, err = startRank(s, env, dir, rout, rerr, start, p.RankOffset+local, local, w.exits, flush, &wg)
		}
		if err != nil {
			w.kill(syscall.SIGKILL)
			wg.Wait()
			return nil, fmt.Errorf("starting local rank %d (%s): %w%s", local, s.Command, err, startHint(s, dir, err))
		}
		w.procs = append(w.procs, proc)
		w.groups = append(w.groups, proc.group)
	}
	go func() { wg.Wait(); close(w.done) }()
	return w, nil
}

// startRank starts one rank as the supervisor's own child.
func startRank(s *Spec, env []string, dir string, stdout, stderr io.Writer, start func(*exec.Cmd) error,
	rank, local int, exits chan<- exit, flush func(), wg *sync.WaitGroup) (*rankProc, error) {
	cmd := exec.Command(s.Command, s.Args...)
	cmd.Env = env
	path, err := CommandPath(s.Command, env)
	if err != nil {
		return nil, err
	}
	// exec.Command looked the name up in the supervisor's own PATH.
	cmd.Path, cmd.Err = path, nil
	cmd.Dir = dir
	// The user's credential is applied in the child before it changes
	// directory and, last, sets the parent-death signal (which a change
	// of credentials would clear).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if s.RunAs != nil {
		cmd.SysProcAttr.Credential = s.RunAs.sys()
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// A worker's own children can hold its output pipe open after it
	// exits; do not let them keep the round from ending.
	cmd.WaitDelay = outputWaitDelay
	if err := start(cmd); err != nil {
		return nil, err
	}
	r := &rankProc{pid: cmd.Process.Pid, cmd: cmd, pidfd: -1}
	// Read before the rank can be reaped (the supervisor reaps it): until
	// then /proc/PID is the rank's.
	ticks, _ := processStart(r.pid)
	r.group = ProcessGroup{PGID: r.pid, StartTicks: ticks}
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := cmd.Wait()
		r.reaped.Store(true)
		if flush != nil {
			flush()
		}
		exits <- exit{LocalRank: local, Rank: rank, Code: exitCode(cmd, err), Err: waitErr(err)}
	}()
	return r, nil
}

// outputWaitDelay is how long a rank's output is read after it exited
// while its children still hold the pipe.
const outputWaitDelay = 2 * time.Second

// forkRank has z fork the rank, with pipes for its output read as a
// started rank's would be.
func forkRank(z *zygote, l pylaunch.Launch, env []string, dir string, stdout, stderr io.Writer, uid uint32,
	rank int, exits chan<- exit, flush func(), wg *sync.WaitGroup) (*rankProc, error) {
	local := z.slot
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	envMap := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			envMap[k] = v
		}
	}
	req := forkRequest{Argv: l.Argv, Env: envMap, Dir: dir, Mode: "script", Target: l.Target,
		Unbuffered: l.Unbuffered, NoBytecode: l.NoBytecode}
	if l.Module {
		req.Mode = "module"
	}
	pid, err := z.fork(req, [3]*os.File{devnull, outW, errW})
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("preloaded interpreter: %w", err)
	}
	pidfd, group, err := forkedRank(pid, z.cmd.Process.Pid, uid)
	if err != nil {
		// The interpreter runs the job's code and lied, or its child is
		// already gone: end it (its own group, which the supervisor made)
		// rather than act on its word (the slot gets a new one next round).
		outR.Close()
		errR.Close()
		z.close()
		return nil, err
	}
	r := &rankProc{pid: pid, pidfd: pidfd, group: group}
	var copies sync.WaitGroup
	copies.Add(2)
	for _, c := range []struct {
		r *os.File
		w io.Writer
	}{{outR, stdout}, {errR, stderr}} {
		go func() {
			defer copies.Done()
			_, _ = io.Copy(c.w, c.r)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		ws, werr := z.wait(pid)
		r.reaped.Store(true)
		r.closePidfd()
		// As exec.Cmd's WaitDelay: the rank's children may hold its
		// output; read what comes for a while, then stop.
		copied := make(chan struct{})
		go func() { copies.Wait(); close(copied) }()
		select {
		case <-copied:
		case <-time.After(outputWaitDelay):
		}
		outR.Close()
		errR.Close()
		<-copied
		if flush != nil {
			flush()
		}
		e := exit{LocalRank: local, Rank: rank}
		switch {
		case werr != nil:
			// The zygote died, and the rank with it (its parent-death
			// signal): as a rank killed by SIGKILL.
			e.Code, e.Err = 128+int(syscall.SIGKILL), werr
		case ws.Signaled():
			e.Code = 128 + int(ws.Signal())
		default:
			e.Code = ws.ExitStatus()
		}
		exits <- e
	}()
	return r, nil
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
	for _, r := range w.procs {
		r.killGroup(sig)
	}
}

// signal passes sig to each rank process only, not its group: a rank that
// wants its children told (DataLoader workers, which mostly do not handle
// HUP or USR1 and would die of it) does so itself.
func (w *workers) signal(sig syscall.Signal) {
	for _, r := range w.procs {
		r.signal(sig)
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

// maxLineBytes is the longest line the supervisor holds while waiting for
// its end; a longer one is passed on cut in pieces of this size.
const maxLineBytes = 64 << 10

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
	var b bytes.Buffer
	if i >= 0 {
		for _, line := range bytes.SplitAfter(l.buf[:i+1], []byte{'\n'}) {
			if len(line) > 0 {
				b.WriteString(l.prefix)
				b.Write(line)
			}
		}
		l.buf = append(l.buf[:0], l.buf[i+1:]...)
	}
	// A rank that never ends its line (a progress bar, or on purpose)
	// must not make the root supervisor hold its output without bound:
	// past maxLineBytes the line is cut and passed on in pieces.
	for len(l.buf) > maxLineBytes {
		b.WriteString(l.prefix)
		b.Write(l.buf[:maxLineBytes])
		b.WriteByte('\n')
		l.buf = append(l.buf[:0], l.buf[maxLineBytes:]...)
	}
	if b.Len() == 0 {
		return len(p), nil
	}
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

// teeWriter passes a rank's output on unchanged and shows what was passed
// on to copy, whose errors (a trial's line reader has none) never reach the
// rank.
type teeWriter struct {
	out  io.Writer
	copy io.Writer
}

func (t *teeWriter) Write(p []byte) (int, error) {
	n, err := t.out.Write(p)
	_, _ = t.copy.Write(p[:n])
	return n, err
}

// startHint explains a rank that could not start for want of permission as
// the task's user: the kernel does not say whether it was entering the
// working directory (most often: the Nomad client's data_dir is not
// traversable by the user) or executing the command.
func startHint(s *Spec, dir string, err error) string {
	if s.RunAs == nil || !errors.Is(err, os.ErrPermission) {
		return ""
	}
	return fmt.Sprintf(" (the ranks run as user %s, who must be able to reach the working directory %s, "+
		"which needs the Nomad client's data_dir and every directory above it traversable (e.g. mode 0711), "+
		"and to execute the command)", s.RunAs.User, dir)
}

// ranksUID is the user the ranks run as: the spec's, else the supervisor's
// own.
func ranksUID(s *Spec) uint32 {
	if s.RunAs != nil {
		return s.RunAs.UID
	}
	return uint32(os.Geteuid())
}
