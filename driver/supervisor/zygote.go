package supervisor

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpujob/gpujob/internal/pylaunch"
)

// Warm restarts. With Spec.Preload, each local rank slot has a zygote: the
// task's Python interpreter, started once, that has imported the listed
// modules (torch, most of the time of a rank's start) and forks a child per
// round that becomes the rank (zygote.py says how). A group restart then
// costs a fork instead of an interpreter start and an import.
//
// The zygote reaps its child and reports the wait status; the supervisor
// does everything else by PID and process group, as for a rank it started
// itself. The zygote is the supervisor's child with the parent-death signal,
// and each rank has the zygote as its parent with the same signal, so
// killing the supervisor still ends every rank.

//go:embed zygote.py
var zygoteSource []byte

// zygoteBootstrap is the zygote's `-c` program: the source comes as the
// control socket's first message, so that `ps` shows a line, not a page.
const zygoteBootstrap = "import socket;ctl=socket.socket(fileno=3);exec(ctl.recv(1<<20))"

// zygoteReadyTimeout bounds the preload: an import that takes longer than
// this (a hung filesystem) leaves the slot to cold starts.
const zygoteReadyTimeout = 3 * time.Minute

// zygoteEnvPad is room in a zygote's environment for the per-round
// variables its ranks get on top (RANK, MASTER_ADDR, ...), so that a rank
// can show its real environment in /proc/PID/environ (zygote.py,
// rewrite_environ). It is one variable the rank never sees.
const zygoteEnvPad = "GPUJOB_PRELOAD_PAD"

// zygote is one slot's preloaded interpreter.
type zygote struct {
	slot  int
	cmd   *exec.Cmd
	conn  *net.UnixConn
	group ProcessGroup
	ready chan struct{} // closed once the preload is done or err is set
	err   error         // why the slot starts cold
	exit  chan error
}

// startZygote starts slot's zygote through start (the spawner's) and
// returns at once; z.ready closes when the preload is done or failed.
func startZygote(s *Spec, env []string, slot int, stderr io.Writer, start func(*exec.Cmd) error) *zygote {
	z := &zygote{slot: slot, ready: make(chan struct{}), exit: make(chan error, 1)}
	fail := func(err error) *zygote {
		z.err = err
		close(z.ready)
		return z
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("control socket: %w", err))
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "zygote-control"), os.NewFile(uintptr(fds[1]), "zygote-control")
	defer theirs.Close()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return fail(fmt.Errorf("control socket: %w", err))
	}
	z.conn = c.(*net.UnixConn)

	args := append([]string{"-c", zygoteBootstrap, "gpujob-preload"}, s.Preload...)
	cmd := exec.Command(s.Command, args...)
	cmd.Env = zygoteEnv(env, s)
	if cmd.Path, err = CommandPath(s.Command, cmd.Env); err != nil {
		z.conn.Close()
		return fail(err)
	}
	cmd.Err = nil // exec.Command looked s.Command up in the supervisor's own PATH
	cmd.Dir = s.Workdir
	if cmd.Dir == "" {
		cmd.Dir, _ = os.Getwd()
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if s.RunAs != nil {
		cmd.SysProcAttr.Credential = s.RunAs.sys()
	}
	// The zygote prints nothing of its own; a crash of it (a traceback)
	// is worth seeing.
	var mu sync.Mutex
	lw := &lineWriter{prefix: fmt.Sprintf("[preload %d] ", slot), out: stderr, mu: &mu}
	cmd.Stdout, cmd.Stderr = lw, lw
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.WaitDelay = time.Second
	if err := start(cmd); err != nil {
		z.conn.Close()
		return fail(fmt.Errorf("starting %s: %w", s.Command, err))
	}
	z.cmd = cmd
	ticks, _ := processStart(cmd.Process.Pid)
	z.group = ProcessGroup{PGID: cmd.Process.Pid, StartTicks: ticks}
	go func() {
		z.exit <- cmd.Wait()
		lw.flush()
	}()
	go func() {
		err := z.handshake()
		if err != nil {
			z.err = err
			z.close()
		}
		close(z.ready)
	}()
	return z
}

// zygoteEnv is what the zygote starts with: the environment of the slot's
// ranks without the variables of one round, which torch reads only when the
// script calls init_process_group, while those read at import
// (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, PYTHON*) are already the rank's.
// The padding leaves room to show a rank's full environment.
func zygoteEnv(base []string, s *Spec) []string {
	return append(ExecEnv(base, s), zygoteEnvPad+"="+strings.Repeat("_", 4096))
}

// handshake sends the zygote its source and waits for its preload.
func (z *zygote) handshake() error {
	deadline := time.Now().Add(zygoteReadyTimeout)
	_ = z.conn.SetDeadline(deadline)
	defer z.conn.SetDeadline(time.Time{})
	if _, err := z.conn.Write(zygoteSource); err != nil {
		return fmt.Errorf("sending the preload program: %w", z.diedOr(err))
	}
	var ready struct {
		Ready bool   `json:"ready"`
		Error string `json:"error"`
	}
	if err := z.read(&ready); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("the preload took longer than %s", zygoteReadyTimeout)
		}
		return err
	}
	if !ready.Ready {
		return errors.New(ready.Error)
	}
	return nil
}

// read reads one message into v.
func (z *zygote) read(v any) error {
	buf := make([]byte, 64<<10)
	n, err := z.conn.Read(buf)
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err != nil {
		return z.diedOr(err)
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		return fmt.Errorf("a message from the preloaded interpreter: %w", err)
	}
	return nil
}

// diedOr says "the preloaded interpreter exited ..." when it did, else err.
func (z *zygote) diedOr(err error) error {
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		return err
	}
	select {
	case werr := <-z.exit:
		z.exit <- werr
		if werr != nil {
			return fmt.Errorf("the preloaded interpreter exited: %v", werr)
		}
		return errors.New("the preloaded interpreter exited")
	case <-time.After(time.Second):
		return errors.New("the preloaded interpreter closed its control socket")
	}
}

// usable reports whether the zygote has preloaded and still serves; one
// still preloading does not serve yet.
func (z *zygote) usable() bool {
	select {
	case <-z.ready:
	default:
		return false
	}
	if z.err != nil {
		return false
	}
	select {
	case err := <-z.exit:
		z.exit <- err
		return false
	default:
		return true
	}
}

// forkRequest is one rank for the zygote to become (zygote.py).
type forkRequest struct {
	Argv       []string          `json:"argv"`
	Env        map[string]string `json:"env"`
	Dir        string            `json:"dir"`
	Mode       string            `json:"mode"` // script or module
	Target     string            `json:"target"`
	Unbuffered bool              `json:"unbuffered"`
	NoBytecode bool              `json:"no_bytecode"`
}

// fork has the zygote start a rank with stdio and returns its PID. The
// caller closes its copies of stdio once fork returns.
func (z *zygote) fork(req forkRequest, stdio [3]*os.File) (int, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	rights := syscall.UnixRights(int(stdio[0].Fd()), int(stdio[1].Fd()), int(stdio[2].Fd()))
	if _, _, err := z.conn.WriteMsgUnix(b, rights, nil); err != nil {
		return 0, fmt.Errorf("asking the preloaded interpreter to fork: %w", z.diedOr(err))
	}
	var forked struct {
		Forked int `json:"forked"`
	}
	if err := z.read(&forked); err != nil {
		return 0, err
	}
	if forked.Forked <= 0 {
		return 0, errors.New("the preloaded interpreter did not say which process it forked")
	}
	return forked.Forked, nil
}

// wait waits for the zygote to report pid's end.
func (z *zygote) wait(pid int) (syscall.WaitStatus, error) {
	var exited struct {
		Exited int `json:"exited"`
		Status int `json:"status"`
	}
	if err := z.read(&exited); err != nil {
		return 0, err
	}
	if exited.Exited != pid {
		return 0, fmt.Errorf("the preloaded interpreter reported process %d, not rank process %d", exited.Exited, pid)
	}
	return syscall.WaitStatus(exited.Status), nil
}

// close ends the zygote: closing its control socket ends its loop; its
// group is killed so nothing it started stays.
func (z *zygote) close() {
	if z.conn != nil {
		z.conn.Close()
	}
	if z.cmd != nil && z.cmd.Process != nil {
		_ = syscall.Kill(-z.cmd.Process.Pid, syscall.SIGKILL)
		<-z.exit
		z.exit <- nil
	}
}

// zygotes are the supervisor's preloaded interpreters, one per local rank
// slot. A slot whose zygote failed to preload starts its ranks cold; one
// whose zygote died after serving gets a new one, started while the ranks
// of the round run.
type zygotes struct {
	spec   *Spec
	env    []string
	stderr io.Writer
	start  func(*exec.Cmd) error
	launch pylaunch.Launch

	mu       sync.Mutex
	slots    []*zygote
	reported map[int]bool // slots whose cold start was already told
}

func newZygotes(s *Spec, env []string, stderr io.Writer, start func(*exec.Cmd) error) (*zygotes, error) {
	launch, err := pylaunch.Parse(s.Command, s.Args)
	if err != nil {
		return nil, err
	}
	p := &zygotes{spec: s, env: env, stderr: stderr, start: start, launch: launch, reported: map[int]bool{}}
	for slot := 0; slot < s.NProcPerNode; slot++ {
		p.slots = append(p.slots, startZygote(s, env, slot, stderr, start))
	}
	return p, nil
}

// prepare waits until every slot's zygote has preloaded or failed (or ctx
// ends), and returns the failures not reported yet, in words for a task
// event. Zygotes that died since the last round are replaced first.
func (p *zygotes) prepare(ctx context.Context) string {
	p.mu.Lock()
	for i, z := range p.slots {
		select {
		case <-z.ready:
			if z.err == nil && !z.usable() {
				z.close()
				p.slots[i] = startZygote(p.spec, p.env, i, p.stderr, p.start)
			}
		default:
		}
	}
	slots := append([]*zygote(nil), p.slots...)
	p.mu.Unlock()
	var cold []string
	for _, z := range slots {
		select {
		case <-z.ready:
		case <-ctx.Done():
			return ""
		}
		if !z.usable() && !p.reported[z.slot] {
			p.reported[z.slot] = true
			cold = append(cold, fmt.Sprintf("local rank %d: %v", z.slot, z.err))
		}
	}
	if len(cold) == 0 {
		return ""
	}
	return "preload failed, starting cold (" + strings.Join(cold, "; ") + ")"
}

// get is slot's zygote when it can serve, else nil (start the rank cold).
func (p *zygotes) get(slot int) *zygote {
	p.mu.Lock()
	z := p.slots[slot]
	p.mu.Unlock()
	if !z.usable() {
		return nil
	}
	return z
}

// groups are the zygotes' process groups, for the driver's cleanup.
func (p *zygotes) groups() []ProcessGroup {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ProcessGroup
	for _, z := range p.slots {
		if z.group.PGID > 0 {
			out = append(out, z.group)
		}
	}
	return out
}

func (p *zygotes) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, z := range p.slots {
		<-z.ready
		z.close()
	}
}
