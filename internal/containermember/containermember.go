// Package containermember is the layout that a container member's two
// tasks agree on: the gpujob-driver sidecar that prepares the member, and the
// docker-driver task whose container runs the supervisor. `gpujob render`
// writes the docker task's mounts and command from these names, and the
// driver fills the directories they name, so both sides import them from
// here rather than repeating the strings.
package containermember

import "path"

const (
	// RunRoot is the host directory under which the driver keeps, per
	// allocation, what the container mounts read-only: RunRoot/<alloc ID>.
	// It is outside the allocation directory, so Nomad's alloc fs API (which
	// anyone with read-fs in the namespace may use) cannot read the spec
	// and its Consul token.
	RunRoot = "/run/gpujob"
	// MountPoint is where the container sees RunRoot/<alloc ID>.
	MountPoint = "/gpujob"
	// SupervisorName and SpecName are the two files in that directory: the
	// static supervisor binary and its spec.
	SupervisorName = "supervisor"
	SpecName       = "spec.json"
	// EventsDir is the directory, inside the allocation's shared directory
	// (/alloc in every task), where the supervisor in the container appends
	// its events for the sidecar to relay: EventsDir/<task>.events.
	EventsDir = "gpujob"
	// SharedDir is Nomad's shared allocation directory as a task sees it.
	SharedDir = "/alloc"
)

// HostRunDir is the host directory mounted at MountPoint for an allocation.
// allocID must be Nomad's (a UUID); callers check it.
func HostRunDir(allocID string) string { return path.Join(RunRoot, allocID) }

// SupervisorPath and SpecPath are the files as the container sees them.
func SupervisorPath() string { return path.Join(MountPoint, SupervisorName) }
func SpecPath() string       { return path.Join(MountPoint, SpecName) }

// EventsFile is the events file of the container task as it sees it; the
// name must be a safe path segment (safename.Encode of the task's name).
func EventsFile(taskSegment string) string {
	return path.Join(SharedDir, EventsDir, taskSegment+".events")
}
