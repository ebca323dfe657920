// Package spec reads gpujob training specs: one small HCL2 file with a
// `train "<name>" { … }` block (and `variable` blocks) that the render
// package turns into a Nomad jobspec for the gpujob task driver.
//
//	variable "workers" {
//	  type    = number
//	  default = 2
//	}
//
//	train "bert-finetune" {
//	  workers         = var.workers
//	  gpus_per_worker = 1
//	  command         = "/usr/bin/python3"
//	  args            = ["bert_finetune.py"]
//	  checkpoint {
//	    every = 20
//	  }
//	}
//
// Every error is an hcl.Diagnostic whose Subject points at the offending
// file:line:col; Format prints them.
package spec

import (
	"time"

	"github.com/hashicorp/hcl/v2"
)

// Defaults of the optional train fields.
const (
	DefaultWorkers           = 1
	DefaultGPUsPerWorker     = 1
	DefaultCPU               = 1000 // MHz
	DefaultMemoryMiB         = 2048
	DefaultMaxFailures       = 3
	DefaultRendezvousTimeout = 5 * time.Minute
	DefaultPriority          = 50
	// DefaultCheckpointGrace is checkpoint_grace when unset: Nomad
	// clients' default max_kill_timeout, so no client shortens it.
	DefaultCheckpointGrace = 30 * time.Second
)

// MaxCheckpointGrace bounds checkpoint_grace: a stop (a preemption, a
// cancel, a drain) holds the gang's GPUs that long at most.
const MaxCheckpointGrace = 10 * time.Minute

// MaxWorkers is the largest group the gpujob driver runs: its rendezvous's
// limit (rendezvous.MaxMembers; a test keeps the two equal).
const MaxWorkers = 10000

// Nomad's own limits (structs.MinResources, the job priority range).
const (
	MinCPU       = 1
	MinMemoryMiB = 10
	MinPriority  = 1
	MaxPriority  = 100
)

// Train is a decoded `train` block with defaults applied and variables
// resolved.
type Train struct {
	Name          string
	Workers       int // allocations in the group, >= 1
	GPUsPerWorker int // nvidia/gpu devices per allocation, >= 0 (0: CPU job)
	Command       string
	Args          []string
	Env           map[string]string
	// Workdir is the ranks' working directory: an absolute host path,
	// normally on shared storage (a path in the image for an image job).
	// Empty: the task directory.
	Workdir string
	// Preload lists Python modules each rank slot imports once into a
	// waiting interpreter, so that a group restart forks the ranks instead
	// of starting Python again (the driver's preload).
	Preload []string
	// Image is the container image every member runs in, through Nomad's
	// docker driver, with a gpujob-driver sidecar that prepares it; empty:
	// the members are host processes of the gpujob driver.
	Image string
	// ImagePull is image_pull { … }: how the docker driver pulls Image;
	// nil when the spec has no such block.
	ImagePull *ImagePull
	Artifacts []Artifact
	Resources Resources
	// GPU holds device constraints; nil when the spec has no gpu block.
	GPU *GPU
	// CheckpointEvery is checkpoint { every } in steps; 0 when unset.
	CheckpointEvery   int
	MaxFailures       int // group restarts (the driver's max_restarts)
	RendezvousTimeout time.Duration
	// CheckpointGrace is checkpoint_grace: how long a stopping member's
	// ranks have between SIGTERM and SIGKILL to save a checkpoint (the
	// tasks' kill_timeout); 0 in a Train built in code is the default.
	CheckpointGrace time.Duration
	Datacenters     []string
	NodePool        string
	Namespace       string
	Priority        int
	// Queue is the queue the job is submitted into; "" is the default
	// queue. submit --queue overrides it.
	Queue string
	Meta  map[string]string
	// Ranges locate the block and its fields in the source, for errors
	// found later (CheckFits, a plan that cannot place the job).
	Ranges Ranges
}

// Artifact is Nomad's artifact block.
type Artifact struct {
	Source      string
	Destination string
	Options     map[string]string
}

// ImagePull holds the docker driver's pull settings.
type ImagePull struct {
	Force   bool          // force_pull
	Timeout time.Duration // image_pull_timeout; 0: the docker driver's default
	// Auth is the registry login; nil: the client's own docker credentials.
	Auth *RegistryAuth
}

// RegistryAuth is the docker driver's auth block; empty fields are left out.
type RegistryAuth struct {
	Username      string
	Password      string
	ServerAddress string
}

// Resources are one member's reservation.
type Resources struct {
	CPU       int // MHz
	MemoryMiB int
	// ShmMiB is the /dev/shm the ranks' DataLoader workers may fill. On the
	// host its pages count against the task's memory, so the rendered task
	// reserves MemoryMiB + ShmMiB; in a container it is the docker driver's
	// shm_size instead.
	ShmMiB int
}

// TaskMemoryMiB is the memory a host member's task reserves: memory + shm.
func (r Resources) TaskMemoryMiB() int { return r.MemoryMiB + r.ShmMiB }

// The reservation of an image job's gpujob sidecar, which only prepares the
// container member and relays its events: the ranks run in the container.
const (
	SidecarCPU       = 50 // MHz
	SidecarMemoryMiB = 64
)

// MemberMemoryMiB is the memory the member task reserves: memory + shm on
// the host (TaskMemoryMiB), memory alone in a container, whose /dev/shm is
// the docker driver's shm_size.
func (t *Train) MemberMemoryMiB() int {
	if t.Image != "" {
		return t.Resources.MemoryMiB
	}
	return t.Resources.TaskMemoryMiB()
}

// WorkerCPU and WorkerMemoryMiB are what one worker's allocation reserves:
// the member task's, plus the sidecar's for an image job. Capacity checks
// count with these.
func (t *Train) WorkerCPU() int {
	if t.Image != "" {
		return t.Resources.CPU + SidecarCPU
	}
	return t.Resources.CPU
}

func (t *Train) WorkerMemoryMiB() int {
	if t.Image != "" {
		return t.MemberMemoryMiB() + SidecarMemoryMiB
	}
	return t.MemberMemoryMiB()
}

// GPU holds the device constraints of gpu { model, min_memory }.
type GPU struct {
	Model        string // ${device.model} == Model when set
	MinMemoryMiB int    // ${device.attr.memory} >= MinMemoryMiB when > 0
}

// Options are the variable values given on the command line.
type Options struct {
	// Vars are -var arguments, "key=value"; later ones win.
	Vars []string
	// VarFiles are -var-file paths (HCL attributes, or JSON for *.json);
	// later files win; -var wins over every file.
	VarFiles []string
}

// Ranges locate a Train in its source.
type Ranges struct {
	// Block is the `train "<name>"` header; Name is its label.
	Block, Name hcl.Range
	// Workers and GPUsPerWorker are the attributes' value expressions, or
	// Block when the spec leaves them to their defaults.
	Workers, GPUsPerWorker hcl.Range
	// Attrs holds the value range of every attribute set in the spec, by
	// its path: "command", "resources.memory", "gpu.model", "checkpoint.every", ….
	Attrs map[string]hcl.Range
}

// Of returns the range of the attribute at path, or the block header when
// the spec does not set it.
func (r Ranges) Of(path string) hcl.Range {
	if rng, ok := r.Attrs[path]; ok {
		return rng
	}
	return r.Block
}
