package supervisor

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	consul "github.com/hashicorp/consul/api"
	cleanhttp "github.com/hashicorp/go-cleanhttp"
	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/rendezvous"
)

// Main runs the supervisor described by the spec file and returns the exit
// code. Nomad's executor starts it as the task's process; SIGTERM (a stop)
// stops the workers and leaves the group cleanly.
func Main(specPath string) int {
	spec, err := ReadSpec(specPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
		return 1
	}
	clock := &stopClock{}
	ctx, stop := notifyStop(context.Background(), clock, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Other signals (nomad alloc signal) go to the workers. Caught from the
	// start: their default action would end the supervisor, and with it the
	// group's round.
	forward := make(chan os.Signal, 4)
	signal.Notify(forward, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGQUIT)
	defer signal.Stop(forward)

	// Whatever the container's environment says is the ranks' alone: from
	// here on this process has none of it (a host member's supervisor
	// never had any: the driver starts it with RootEnv).
	base := BaseEnv(spec, os.Environ(), func() {
		os.Clearenv()
		_ = os.Setenv("PATH", RootPath)
	})
	if spec.Container {
		// Root in the container may also be whoever can `nomad alloc
		// exec` into it: not dumpable, this process's memory (the Consul
		// token) is closed to other processes of root's without
		// CAP_SYS_PTRACE, which docker does not grant. The ranks, started
		// by exec, are dumpable as usual.
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			fmt.Fprintf(os.Stderr, "gpujob: warning: cannot close the supervisor's memory to other processes: %v\n", err)
		}
		if err := checkMounted(spec.CheckpointDir, spec.CheckpointDirID); err != nil {
			fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
			return 1
		}
	}
	// The driver made the checkpoint directory, owned by the ranks' user.
	// Before any rank starts, close the node's other GPUs to them; the
	// deferred cleanup runs after Run has reaped every rank.
	if spec.PidsLimit != nil {
		// The ranks may spend the whole allowance: the threads this
		// process will need are started now (threads.go).
		reserveThreads(reservedThreads(spec.NProcPerNode, spec.PidsLimit.Max))
		cleanup, err := limitPids(spec.PidsLimit)
		if err != nil {
			// Refused rather than run unbounded: the limit is the
			// operator's word (pids_limit = 0 turns it off).
			fmt.Fprintf(os.Stderr, "gpujob: %v (the driver's pids_limit)\n", err)
			return 1
		}
		defer cleanup()
	}
	if spec.GPUIsolation != nil {
		cleanup, err := isolateGPUs(spec.GPUIsolation)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gpujob: warning: the device cgroup does not keep the ranks off the node's other GPUs (%v); "+
				"only CUDA_VISIBLE_DEVICES points them at the task's own\n", err)
		}
		defer cleanup()
	}
	if spec.Solo {
		return runSolo(ctx, spec, base, forward, clock)
	}
	client, err := consulClient(spec.Consul)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
		return 1
	}
	rdv, err := rendezvous.New(rendezvous.Config{
		Client:      client,
		Prefix:      spec.Consul.KeyPrefix,
		RunID:       spec.RunID,
		RunGroup:    spec.RunGroup,
		SessionTTL:  time.Duration(spec.Consul.SessionTTL),
		Min:         spec.Min,
		Max:         spec.Max,
		JoinTimeout: time.Duration(spec.JoinTimeout),
		LastCall:    time.Duration(spec.LastCall),
		MaxRestarts: spec.MaxRestarts,
		Expected:    spec.Expected,
		Logf:        consulLog(os.Stderr),
	}, rendezvous.Member{
		ID:             spec.Self.ID,
		Name:           spec.Self.Name,
		Addr:           spec.Self.Addr,
		LocalWorldSize: spec.NProcPerNode,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
		return 1
	}
	if err := rdv.Open(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: joining the group through Consul at %s: %v\n", spec.Consul.Address, err)
		return 1
	}
	code := 1
	var sup *Supervisor
	var trial *consulTrial
	if spec.Report != nil {
		trial = newConsulTrial(client, spec, os.Stderr)
	}
	defer func() {
		// After a stop, leaving must fit in what is left of Nomad's
		// kill_timeout (the supervisor planned it when the stop came).
		deadline := time.Now().Add(defaultLeaveTimeout)
		if sup != nil {
			deadline = sup.LeaveDeadline()
		}
		closeCtx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		leave := rdv.Close
		if code == ExitStopped || (sup != nil && sup.TrialStopped()) {
			// Nomad stopped this task, or the sweep its trial, on
			// purpose: if the whole job is stopping, the last member
			// out deletes the run's state.
			leave = rdv.Stop
		}
		// A trial's metrics record is given up (a last write, its
		// session destroyed) beside the leaving, in the same time.
		var closed sync.WaitGroup
		if trial != nil {
			closed.Go(func() { trial.Close(closeCtx) })
		}
		if err := leave(closeCtx); err != nil {
			fmt.Fprintf(os.Stderr, "gpujob: leaving the group: %v\n", err)
		}
		closed.Wait()
	}()

	sup, err = New(spec, rdv, base, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
		return 1
	}
	sup.stopSignal = clock
	if trial != nil {
		sup.SetTrial(trial)
	}
	go func() {
		for sig := range forward {
			sup.Signal(sig.(syscall.Signal))
		}
	}()
	code = sup.Run(ctx)
	return code
}

// runSolo runs a member that joins no group (a service replica): no Consul,
// nothing to leave.
func runSolo(ctx context.Context, spec *Spec, base []string, forward <-chan os.Signal, clock *stopClock) int {
	sup, err := New(spec, newSolo(spec), base, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpujob: %v\n", err)
		return 1
	}
	sup.stopSignal = clock
	go func() {
		for sig := range forward {
			sup.Signal(sig.(syscall.Signal))
		}
	}()
	return sup.Run(ctx)
}

// CheckConsul asks Consul for its leader: the driver's health check that the
// supervisors on this node will be able to rendezvous.
func CheckConsul(ctx context.Context, s ConsulSpec) error {
	client, err := consulClient(s)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	q := (&consul.QueryOptions{}).WithContext(ctx)
	var leader string
	if _, err := client.Raw().Query("/v1/status/leader", &leader, q); err != nil {
		return fmt.Errorf("consul at %s is unreachable: %w", s.Address, err)
	}
	if leader == "" {
		return fmt.Errorf("consul at %s has no leader", s.Address)
	}
	return checkToken(ctx, client, s)
}

// consulClient builds a Consul client from the spec alone. Not from
// consul.DefaultConfig, which reads CONSUL_HTTP_* and whose transport
// honours HTTP_PROXY: the driver fills the spec from the agent's own
// environment, and nothing else may say where the token goes.
func consulClient(s ConsulSpec) (*consul.Client, error) {
	cfg := &consul.Config{Address: "127.0.0.1:8500", Scheme: "http", Transport: cleanhttp.DefaultPooledTransport()}
	cfg.Transport.Proxy = nil
	if s.Address != "" {
		cfg.Address = s.Address
	}
	cfg.Token, cfg.Datacenter = s.Token, s.Datacenter
	if s.Scheme != "" {
		cfg.Scheme = s.Scheme
	}
	// The driver passes the TLS material inline (ca_pem, ...), read as
	// root: the supervisor runs as the task's user, who need not be able to
	// read the client's key files. Paths are still honoured (a spec written
	// by hand, and the driver's own health check).
	cfg.TLSConfig = consul.TLSConfig{
		CAFile: s.CAFile, CertFile: s.CertFile, KeyFile: s.KeyFile,
		CAPem: []byte(s.CAPEM), CertPEM: []byte(s.CertPEM), KeyPEM: []byte(s.KeyPEM),
	}
	// No gzip: the supervisor talks to the node's own agent, and the
	// rendezvous roster it reads is gzip'd already. At a thousand members
	// compressing every watch answer cost the agent a fifth of its CPU.
	cfg.Transport.DisableCompression = true
	c, err := consul.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client for %s: %w", cfg.Address, err)
	}
	return c, nil
}

// checkMounted refuses to start a container member whose checkpoint
// directory the container does not have: the driver made it on the host, so
// without the job's bind mount the ranks would write their checkpoints into
// the container, and lose them with it. id is the host directory's
// "<device>:<inode>" (a bind mount shows the same); a directory of the
// image's own at the same path, or a mount of the one above it, has
// another.
func checkMounted(dir, id string) error {
	var st unix.Stat_t
	err := unix.Stat(dir, &st)
	if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && (id == "" || fmt.Sprintf("%d:%d", st.Dev, st.Ino) == id) {
		return nil
	}
	what := "is not in the container"
	if err == nil {
		what = "in the container is not the host's"
	}
	return fmt.Errorf("the checkpoint directory %s %s: the docker task needs it bind-mounted at the same path "+
		"(gpujob render writes that mount; render again with the clients' checkpoint root in GPUJOB_CHECKPOINT_ROOT)", dir, what)
}
