// Package acl holds gpujob's ACL policies for Nomad and Consul (the .hcl
// files of this folder, embedded) and renders them: the policies of a
// namespace's users are templates of the namespace, since a policy that
// granted every namespace's tree would let one tenant rewrite another's
// sweeps and services. `gpujob acl policy` prints them; scripts/dev-up.sh
// applies what it prints.
package acl

import (
	"bytes"
	"embed"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/gpujob/gpujob/internal/contract"
)

//go:embed *.hcl
var files embed.FS

// Defaults of Params' key prefixes (internal/sweep/sweepkv and
// internal/servekv hold the same; this package imports neither so that it
// stays a leaf).
const (
	DefaultSweepPrefix   = "gpujob/sweeps"
	DefaultServicePrefix = "gpujob/services"
)

// Policy is one of the embedded policies.
type Policy struct {
	// Name is what gpujob acl policy takes: the file's name without
	// ".hcl" and without its "gpujob-" (consul-gpujob-sweeps.hcl is
	// consul-sweeps).
	Name string
	File string
	// System says whether it is Nomad's or Consul's policy.
	System string
	// Summary is one line about who holds it.
	Summary string
	// PerNamespace: the policy is a template of one Nomad namespace.
	PerNamespace bool
	// ReadOnly: it can be rendered read-only (Params.ReadOnly).
	ReadOnly bool
}

// known describes the policies gpujob documents; a file without an entry
// is still listed and rendered, with its name for a summary.
var known = map[string]Policy{
	"consul-sweeps":           {Summary: "a user's Consul token for the sweeps of one namespace", PerNamespace: true, ReadOnly: true},
	"consul-services":         {Summary: "a user's Consul token for the services (routes, tokens) of one namespace", PerNamespace: true, ReadOnly: true},
	"nomad-submit":            {Summary: "a user who submits, watches and stops jobs in one namespace", PerNamespace: true},
	"nomad-readonly":          {Summary: "a user who only looks at one namespace", PerNamespace: true},
	"consul-driver":           {Summary: "the gpujob task driver's Consul token (the supervisors' rendezvous and trial metrics)"},
	"consul-nomad-agent":      {Summary: "the Nomad agents' own Consul token"},
	"consul-gateway":          {Summary: "the gateways' Consul token"},
	"nomad-gateway":           {Summary: "the gateways' Nomad token"},
	"consul-exporter":         {Summary: "the exporters' Consul token (read the sweeps and the queues)"},
	"consul-queues":           {Summary: "the queue configuration: write for who applies queue files; --read-only for users", ReadOnly: true},
	"nomad-exporter":          {Summary: "the exporters' Nomad token (read nodes, jobs, allocations, logs)"},
	"consul-queue-controller": {Summary: "the queue admission controller's Consul token (the queue state: statuses, counters, leader key)"},
	"nomad-queue-controller":  {Summary: "the queue admission controller's Nomad token (read nodes, plan, register and stop jobs in every namespace)"},
	"consul-queue-submit":     {Summary: "a user's Consul token for queued jobs of one namespace (their records; read their statuses)", PerNamespace: true, ReadOnly: true},
}

// Policies lists the embedded policies by name.
func Policies() []Policy {
	entries, err := files.ReadDir(".")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	var out []Policy
	for _, e := range entries {
		out = append(out, describe(e.Name()))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func describe(file string) Policy {
	name := strings.Replace(strings.TrimSuffix(file, ".hcl"), "gpujob-", "", 1)
	p := known[name]
	p.Name, p.File = name, file
	p.System = strings.SplitN(name, "-", 2)[0]
	if p.Summary == "" {
		p.Summary = file
	}
	return p
}

// Lookup finds a policy by its name or its file's name.
func Lookup(name string) (Policy, error) {
	var names []string
	for _, p := range Policies() {
		if name == p.Name || name == p.File || name+".hcl" == p.File {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Policy{}, fmt.Errorf("no ACL policy %q: gpujob has %s", name, strings.Join(names, ", "))
}

// Params fill a policy's blanks.
type Params struct {
	// Namespace is the Nomad namespace of a per-namespace policy.
	Namespace string
	// SweepPrefix and ServicePrefix are the Consul KV prefixes of sweeps
	// and services, without a trailing slash ("" for the defaults).
	SweepPrefix, ServicePrefix string
	// ReadOnly renders the namespace's keys read instead of write.
	ReadOnly bool
}

// validNamespace is Nomad's rule for namespace names. Such a name is its
// own Consul key segment (internal/safename leaves it as it is), and holds
// nothing that could end a quoted HCL string.
var validNamespace = regexp.MustCompile(`^[a-zA-Z0-9-]{1,128}$`)

// validPrefix is a KV prefix gpujob's records can live under: segments of
// letters, digits, '-', '_' and '.', no empty one, nothing that needs
// quoting in HCL.
var validPrefix = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`)

// Render returns the policy's rules for p.
func Render(pol Policy, p Params) ([]byte, error) {
	if p.SweepPrefix == "" {
		p.SweepPrefix = DefaultSweepPrefix
	}
	if p.ServicePrefix == "" {
		p.ServicePrefix = DefaultServicePrefix
	}
	for _, f := range []struct{ flag, v string }{{"--sweep-prefix", p.SweepPrefix}, {"--service-prefix", p.ServicePrefix}} {
		v := strings.TrimSuffix(f.v, "/")
		if !validPrefix.MatchString(v) || strings.Contains("/"+v+"/", "/../") || strings.Contains("/"+v+"/", "/./") {
			return nil, fmt.Errorf("%s %q: a Consul KV prefix must be segments of letters, digits, '-', '_' and '.' "+
				"separated by single '/' (no '.' or '..' segment)", f.flag, f.v)
		}
		// A namespace's tree is <prefix>/<namespace>/: one that could be
		// the queues' tree (a namespace named "queues" under "gpujob"), or
		// hold it, would let that namespace's users write the queue
		// configuration.
		if q := contract.QueuePrefix + "/"; strings.HasPrefix(q, v+"/") || strings.HasPrefix(v+"/", q) {
			return nil, fmt.Errorf("%s %q: the queue configuration lives under %s/, and a namespace's tree there would let its users write it; "+
				"choose a prefix beside it", f.flag, f.v, contract.QueuePrefix)
		}
	}
	p.SweepPrefix, p.ServicePrefix = strings.TrimSuffix(p.SweepPrefix, "/"), strings.TrimSuffix(p.ServicePrefix, "/")
	switch {
	case pol.PerNamespace && !validNamespace.MatchString(p.Namespace):
		return nil, fmt.Errorf("--namespace %q: policy %s is for one Nomad namespace, and Nomad namespaces are "+
			"1 to 128 letters, digits and '-'", p.Namespace, pol.Name)
	case p.ReadOnly && !pol.ReadOnly:
		var ro []string
		for _, q := range Policies() {
			if q.ReadOnly {
				ro = append(ro, q.Name)
			}
		}
		return nil, fmt.Errorf("--read-only: policy %s has no read-only form (%s have one)", pol.Name, strings.Join(ro, ", "))
	}
	src, err := files.ReadFile(pol.File)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", pol.Name, err)
	}
	t, err := template.New(path.Base(pol.File)).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", pol.Name, err)
	}
	access := "write"
	if p.ReadOnly {
		access = "read"
	}
	var out bytes.Buffer
	err = t.Execute(&out, map[string]string{
		"Namespace": p.Namespace, "SweepPrefix": p.SweepPrefix, "ServicePrefix": p.ServicePrefix, "Access": access,
	})
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", pol.Name, err)
	}
	return out.Bytes(), nil
}
