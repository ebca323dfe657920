// Package supervisor is the process that runs inside a gpujob task: the part
// torchrun calls the elastic agent. It joins the group's rendezvous, starts
// the local worker processes with the torchrun environment, watches them and
// the rest of the group, and restarts the whole group from its checkpoint
// when a member fails. The task driver launches it through Nomad's executor,
// so it outlives a Nomad client restart, and it knows nothing of Nomad.
package supervisor

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/gpujob/gpujob/driver/rendezvous"
	"github.com/gpujob/gpujob/internal/pylaunch"
)

// Spec is everything the supervisor needs, written by the driver to a file in
// the task's private directory (it holds the Consul token, so never the
// environment or the task's own directories).
type Spec struct {
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"` // on top of the task's environment
	// TaskEnv is a host member's task environment (KEY=VALUE), which its
	// ranks start from: the driver starts the supervisor itself with a
	// fixed environment of its own (RootEnv), so that nothing a job sets
	// (LD_PRELOAD, HTTP_PROXY, CONSUL_HTTP_ADDR, ...) reaches a process that
	// runs as root. A container member's supervisor takes the container's
	// environment instead (BaseEnv).
	TaskEnv []string `json:"task_env,omitempty"`
	// HostEnv is what of the Nomad agent's environment the driver's host_env
	// lets through to a container member's ranks, under the container's
	// own environment (a host member's task environment has it already).
	HostEnv map[string]string `json:"host_env,omitempty"`
	// Workdir is where the ranks run; empty means the task directory.
	Workdir string `json:"workdir,omitempty"`
	// NProcPerNode is the number of local worker processes.
	NProcPerNode int  `json:"nproc_per_node"`
	LogPrefix    bool `json:"log_prefix"`
	// Preload lists the Python modules each local rank slot's zygote
	// imports once, so that a rank (re)starts by a fork (zygote.go); empty
	// starts every rank cold.
	Preload []string `json:"preload,omitempty"`

	// RunID names one submission's rendezvous: "<namespace>/<job>/<run>"
	// with run the job meta gpujob_run `gpujob submit` stamps, else
	// "<namespace>/<job>".
	RunID string `json:"run_id"`
	// RunGroup is "<namespace>/<job>": the runs of every submission of the
	// job, so a new one can clear state that can never continue.
	RunGroup string   `json:"run_group,omitempty"`
	RoleName string   `json:"role_name"` // ROLE_NAME
	Self     Member   `json:"self"`
	Expected []string `json:"expected"` // allocation names that should join

	Min         int      `json:"min"`
	Max         int      `json:"max"`
	JoinTimeout Duration `json:"join_timeout"`
	LastCall    Duration `json:"last_call"`
	MaxRestarts int      `json:"max_restarts"`

	CheckpointDir string `json:"checkpoint_dir"`
	// RunAs is the user the ranks run as; nil runs them as the supervisor's
	// own user (a Nomad client that is not root cannot switch).
	RunAs *Credential `json:"run_as,omitempty"`
	// VisibleDevices is the task's GPU reservation (UUIDs, comma-separated;
	// empty for none), which the ranks get as CUDA_VISIBLE_DEVICES and
	// NVIDIA_VISIBLE_DEVICES; nil leaves the task's environment as it is.
	VisibleDevices *string `json:"visible_devices,omitempty"`
	// GPUIsolation, when set, has the supervisor close the node's other
	// GPUs to its ranks through the device cgroup before starting any.
	GPUIsolation *GPUIsolation `json:"gpu_isolation,omitempty"`
	// PidsLimit, when set, caps the task's processes and threads (pids.go).
	PidsLimit *PidsLimit `json:"pids_limit,omitempty"`
	// StopGrace is SIGTERM to SIGKILL for the ranks when a round ends, and
	// when Nomad stops the task without the driver recording a deadline.
	StopGrace Duration `json:"stop_grace"`
	// KillTimeout is a container member's: its docker task's kill_timeout,
	// docker's time from the stop signal to its SIGKILL of the container.
	// No driver records that member a stop deadline (the docker driver, not
	// gpujob's, stops it), so the supervisor reckons one from the moment
	// the stop signal came (stop.go). Zero: the fixed StopGrace.
	KillTimeout Duration `json:"kill_timeout,omitempty"`

	// Solo runs the member on its own: a service replica, which joins no
	// rendezvous and needs no Consul (solo.go). Min and Max are then 1.
	Solo bool `json:"solo,omitempty"`

	Consul ConsulSpec `json:"consul"`
	// EventsFile receives one JSON line per milestone; the driver turns
	// them into Nomad task events.
	EventsFile string `json:"events_file"`
	// GroupsFile receives the ranks' process groups (ProcessGroup), for the
	// driver to kill what is left once the supervisor is gone.
	GroupsFile string `json:"groups_file,omitempty"`
	// StopDeadlineFile is where the driver writes when a stop's SIGKILL
	// comes, before it signals (WriteStopDeadline).
	StopDeadlineFile string `json:"stop_deadline_file,omitempty"`
	// Container says the supervisor runs in a container member's container
	// (the driver's container.go), where the checkpoint directory must be
	// a mount of the host's, never a directory of the container's own.
	Container bool `json:"container,omitempty"`
	// CheckpointDirID is "<device>:<inode>" of the checkpoint directory on
	// the host, which a container member's supervisor compares with what
	// it sees at CheckpointDir (a bind mount keeps both).
	CheckpointDirID string `json:"checkpoint_dir_id,omitempty"`
	// Report makes the task a trial of a sweep (trial.go): the member
	// that hosts global rank 0 forwards its metric lines to the trial's
	// metrics record, and every member obeys the trial's stop request.
	Report *ReportSpec `json:"report,omitempty"`
}

// ReportSpec is where a sweep trial's records are (package sweepkv). The
// driver derives both keys from the job's namespace and the task config's
// sweep and trial.
type ReportSpec struct {
	MetricsKey string `json:"metrics_key"` // sweepkv.MetricsKey
	StopKey    string `json:"stop_key"`    // sweepkv.StopKey
}

// Member identifies this allocation in the rendezvous.
type Member struct {
	ID   string `json:"id"`   // allocation ID
	Name string `json:"name"` // allocation name, e.g. "bert.train[1]"
	Addr string `json:"addr"` // host:port offered as MASTER_ADDR:MASTER_PORT
}

// ConsulSpec is how to reach Consul.
type ConsulSpec struct {
	Address    string `json:"address"`
	Scheme     string `json:"scheme,omitempty"` // "https" for TLS
	Token      string `json:"token,omitempty"`
	Datacenter string `json:"datacenter,omitempty"`
	CAFile     string `json:"ca_file,omitempty"`
	CertFile   string `json:"cert_file,omitempty"`
	KeyFile    string `json:"key_file,omitempty"`
	// CAPEM, CertPEM and KeyPEM are the contents of those files, which the
	// driver puts here instead of the paths (driver.inlineConsulTLS).
	CAPEM      string   `json:"ca_pem,omitempty"`
	CertPEM    string   `json:"cert_pem,omitempty"`
	KeyPEM     string   `json:"key_pem,omitempty"`
	KeyPrefix  string   `json:"key_prefix"`
	SessionTTL Duration `json:"session_ttl"`
}

// Duration is a time.Duration that reads and writes as "30s" in JSON.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Validate reports the first field that cannot work.
func (s *Spec) Validate() error {
	switch {
	case s.Command == "":
		return fmt.Errorf("command is empty")
	case s.NProcPerNode < 1:
		return fmt.Errorf("nproc_per_node must be at least 1, got %d", s.NProcPerNode)
	case s.Min < 1 || s.Max < s.Min:
		return fmt.Errorf("nnodes %d:%d is not a valid min:max", s.Min, s.Max)
	case s.MaxRestarts < 0:
		return fmt.Errorf("max_restarts must be 0 or more, got %d", s.MaxRestarts)
	case s.RunID == "" || s.Self.ID == "":
		return fmt.Errorf("run and member IDs are required")
	case s.Self.Addr == "":
		return fmt.Errorf("member address is empty")
	case s.Solo && (s.Max != 1 || s.Report != nil):
		return fmt.Errorf("a solo member is a group of one and no trial")
	// The rendezvous refuses more; here the job's author hears which field.
	case s.NProcPerNode > rendezvous.MaxLocalWorldSize:
		return fmt.Errorf("nproc_per_node must be at most %d, got %d", rendezvous.MaxLocalWorldSize, s.NProcPerNode)
	case s.KillTimeout < 0:
		return fmt.Errorf("kill_timeout must not be negative, got %s", time.Duration(s.KillTimeout))
	}
	if err := s.Report.validate(); err != nil {
		return err
	}
	if len(s.Preload) > 0 {
		for i, m := range s.Preload {
			if !pylaunch.Module(m) {
				return fmt.Errorf("preload[%d]: %q is not a Python module name (like torch or torch.distributed)", i, m)
			}
		}
		if _, err := pylaunch.Parse(s.Command, s.Args); err != nil {
			return err
		}
	}
	return s.checkExec()
}

// validate checks a report spec (nil is none): both keys, each a relative
// Consul key of clean segments.
func (r *ReportSpec) validate() error {
	if r == nil {
		return nil
	}
	for _, k := range []struct{ field, key string }{{"report.metrics_key", r.MetricsKey}, {"report.stop_key", r.StopKey}} {
		if k.key == "" || strings.HasPrefix(k.key, "/") || strings.HasSuffix(k.key, "/") {
			return fmt.Errorf("%s: %q is not a relative consul key", k.field, k.key)
		}
		for _, seg := range strings.Split(k.key, "/") {
			if seg == "" || seg == "." || seg == ".." {
				return fmt.Errorf("%s: %q has an empty, . or .. segment", k.field, k.key)
			}
		}
	}
	if r.MetricsKey == r.StopKey {
		return fmt.Errorf("report: the metrics and stop keys are both %q", r.MetricsKey)
	}
	return nil
}

// checkExec refuses what exec could not pass to a rank as written, so that
// the job fails at once with the field at fault instead of every rank
// failing to start, round after round: a NUL in the command line (execve
// takes C strings), or an env name that is empty or holds '=' (the variable
// set would be another one than the name says). Invalid UTF-8 is refused
// too: this spec travels as JSON, which would replace it (found by
// FuzzDriverConfigMsgpack; Nomad's job API cannot carry it either).
func (s *Spec) checkExec() error {
	bad := func(v string) string {
		switch {
		case strings.ContainsRune(v, 0):
			return "a NUL byte"
		case !utf8.ValidString(v):
			return "invalid UTF-8"
		}
		return ""
	}
	for i, v := range append([]string{s.Command, s.Workdir}, s.Args...) {
		if why := bad(v); why != "" {
			field := map[int]string{0: "command", 1: "workdir"}[i]
			if field == "" {
				field = fmt.Sprintf("args[%d]", i-2)
			}
			return fmt.Errorf("%s %q contains %s", field, v, why)
		}
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || !utf8.ValidString(k) {
			return fmt.Errorf("env: %q is not a variable name (empty, or holds '=', NUL or invalid UTF-8)", k)
		}
		if why := bad(v); why != "" {
			return fmt.Errorf("env: the value of %s contains %s", k, why)
		}
	}
	return nil
}

// WriteSpec writes s to path readable by the owner only.
func WriteSpec(path string, s *Spec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the supervisor spec: %w", err)
	}
	// Never through a link: the spec holds the Consul token.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("writing the supervisor spec: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("writing the supervisor spec: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing the supervisor spec: %w", err)
	}
	return nil
}

// maxSpecBytes bounds a spec read: the task's environment is in it, and a
// job can make that large; Linux's own limit on a process's arguments and
// environment together is 2 MiB by default.
const maxSpecBytes = 8 << 20

// ReadSpec reads and validates a spec written by WriteSpec.
func ReadSpec(path string) (*Spec, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("reading the supervisor spec: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the supervisor spec: %w", err)
	}
	if len(b) > maxSpecBytes {
		return nil, fmt.Errorf("the supervisor spec %s is over %d bytes", path, maxSpecBytes)
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decoding the supervisor spec %s: %w", path, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("supervisor spec %s: %w", path, err)
	}
	return &s, nil
}
