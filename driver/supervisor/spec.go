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
	"os"
	"time"
)

// Spec is everything the supervisor needs, written by the driver to a file in
// the task's private directory (it holds the Consul token, so never the
// environment or the task's own directories).
type Spec struct {
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"` // on top of the task's environment
	// Workdir is where the ranks run; empty means the task directory.
	Workdir string `json:"workdir,omitempty"`
	// NProcPerNode is the number of local worker processes.
	NProcPerNode int  `json:"nproc_per_node"`
	LogPrefix    bool `json:"log_prefix"`

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
	// StopGrace is SIGTERM to SIGKILL for the ranks when a round ends, and
	// when Nomad stops the task without the driver recording a deadline.
	StopGrace Duration `json:"stop_grace"`

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
}

// Member identifies this allocation in the rendezvous.
type Member struct {
	ID   string `json:"id"`   // allocation ID
	Name string `json:"name"` // allocation name, e.g. "bert.train[1]"
	Addr string `json:"addr"` // host:port offered as MASTER_ADDR:MASTER_PORT
}

// ConsulSpec is how to reach Consul.
type ConsulSpec struct {
	Address    string   `json:"address"`
	Scheme     string   `json:"scheme,omitempty"` // "https" for TLS
	Token      string   `json:"token,omitempty"`
	Datacenter string   `json:"datacenter,omitempty"`
	CAFile     string   `json:"ca_file,omitempty"`
	CertFile   string   `json:"cert_file,omitempty"`
	KeyFile    string   `json:"key_file,omitempty"`
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
	}
	return nil
}

// WriteSpec writes s to path readable by the owner only.
func WriteSpec(path string, s *Spec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the supervisor spec: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("writing the supervisor spec: %w", err)
	}
	return nil
}

// ReadSpec reads and validates a spec written by WriteSpec.
func ReadSpec(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the supervisor spec: %w", err)
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
