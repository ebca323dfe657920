package admit

import (
	"fmt"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
)

// Drivers are the task drivers of the jobs gpujob renders (cli/render):
// its own, and docker for a container member beside the gpujob sidecar.
var Drivers = map[string]bool{contract.DriverName: true, "docker": true}

// defaultNodePool is Nomad's node pool of a job that names none.
const defaultNodePool = "default"

// defaultRegion is Nomad's region of an agent configured with none.
const defaultRegion = "global"

// checkAllowed refuses what a namespace's own user could not have
// registered with their token, or what gpujob never renders: the
// controller registers the job with its own, stronger Nomad token (every
// namespace, every node pool), so whatever such a job carries would
// run with the controller's authority, not the submitter's.
func checkAllowed(job *api.Job) error {
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	switch {
	case str(job.NodePool) != "" && str(job.NodePool) != defaultNodePool:
		// The controller's token may place in every pool, the submitter's
		// perhaps not; and the policy counts the default pool's nodes.
		return fmt.Errorf("job node_pool %q: queued jobs run in the default node pool for now (leave node_pool out)", clip(str(job.NodePool)))
	case job.Multiregion != nil:
		return fmt.Errorf("job has a multiregion block: a queued job runs in the controller's region only")
	case job.Periodic != nil:
		return fmt.Errorf("job is periodic: the queue admits one run of a job, not a schedule")
	case job.ParameterizedJob != nil || job.Dispatched || str(job.ParentID) != "" || str(job.DispatchIdempotencyToken) != "":
		return fmt.Errorf("job is parameterized or dispatched: the queue admits plain batch and service jobs")
	case str(job.ConsulToken) != "" || str(job.VaultToken) != "" || str(job.NomadTokenID) != "":
		return fmt.Errorf("job carries a Consul, Vault or Nomad token: a queued job may not carry credentials (the controller registers it)")
	case str(job.VaultNamespace) != "" || str(job.ConsulNamespace) != "":
		return fmt.Errorf("job names a Consul or Vault namespace, which gpujob never renders")
	case job.Priority != nil && (*job.Priority < 1 || *job.Priority > 100):
		return fmt.Errorf("job priority %d: Nomad's range is 1 to 100", *job.Priority)
	}
	for _, g := range job.TaskGroups {
		if g == nil {
			return fmt.Errorf("a task group is null")
		}
		gname := clip(str(g.Name))
		if len(g.Volumes) > 0 {
			return fmt.Errorf("group %s requests volumes: host and CSI volumes are not for queued jobs (the controller's token could mount what the submitter's cannot)", gname)
		}
		if g.Consul != nil && g.Consul.Namespace != "" {
			// Nomad's canonical form adds an empty one.
			return fmt.Errorf("group %s names a Consul namespace, which gpujob never renders", gname)
		}
		for _, t := range g.Tasks {
			if t == nil {
				return fmt.Errorf("group %s: a task is null", gname)
			}
			tname := clip(t.Name)
			switch {
			case !Drivers[t.Driver]:
				return fmt.Errorf("task %s: driver %q: queued jobs run on the gpujob driver (and docker for a container member)", tname, clip(t.Driver))
			case len(t.VolumeMounts) > 0:
				return fmt.Errorf("task %s mounts volumes (volume_mount): not for queued jobs", tname)
			case t.CSIPluginConfig != nil:
				return fmt.Errorf("task %s is a CSI plugin: not for queued jobs", tname)
			case t.Vault != nil:
				return fmt.Errorf("task %s has a vault block: a queued job may not ask for Vault secrets", tname)
			case len(t.Templates) > 0:
				return fmt.Errorf("task %s has templates, which gpujob never renders (they read Consul and Vault as the client)", tname)
			}
		}
	}
	return nil
}
