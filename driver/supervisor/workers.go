package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	cmds  []*exec.Cmd
	exits chan exit
	done  chan struct{} // closed when every process has been reaped
}

// startWorkers starts s.NProcPerNode processes for placement p.
func startWorkers(s *Spec, p Placement, base []string, stdout, stderr io.Writer) (*workers, error) {
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
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
		if err := cmd.Start(); err != nil {
			w.cmds = append(w.cmds, nil)
			w.kill(syscall.SIGKILL)
			wg.Wait()
			return nil, fmt.Errorf("starting local rank %d (%s): %w", local, s.Command, err)
		}
		w.cmds = append(w.cmds, cmd)
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

// waitErr keeps errors other than the process's own non-zero exit.
func waitErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil
	}
	return err
}

// kill signals every started process group.
func (w *workers) kill(sig syscall.Signal) {
	for _, c := range w.cmds {
		if c != nil && c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, sig)
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
