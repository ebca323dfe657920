package driver

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// defaultUser is who a task's ranks run as when neither the task nor the
// plugin config names a user: the unprivileged account every Linux
// distribution has, as Nomad's exec driver uses it.
const defaultUser = "nobody"

// identityPolicy is what decides who a task runs as: the plugin config and
// the identity of the Nomad client (the driver runs as the client's user).
type identityPolicy struct {
	DefaultUser string
	AllowRoot   bool
	// AllowedUsers are the users any namespace's tasks may run as
	// (allowed_users); NamespaceUsers replaces them for the namespaces it
	// lists (namespace_users), its first user being that namespace's
	// default. Root is decided by AllowRoot alone.
	AllowedUsers   []string
	NamespaceUsers map[string][]string
	// Namespace is the task's Nomad namespace.
	Namespace string
	// ClientUID is the driver's effective UID. Only root can start
	// processes as another user.
	ClientUID int
}

// policyFor is the identity policy of a task in namespace ns under the
// plugin config.
func policyFor(pc *Config, ns string, clientUID int) identityPolicy {
	return identityPolicy{DefaultUser: pc.DefaultUser, AllowRoot: pc.AllowRoot, AllowedUsers: pc.AllowedUsers,
		NamespaceUsers: pc.NamespaceUsers, Namespace: ns, ClientUID: clientUID}
}

// serviceAccounts are gpujob's own accounts: the gateway, the sweep
// controllers and the exporter run as them so that no task can read their
// identity files or Task API sockets. No task ever runs as one, whatever
// the config says; nor as any other account named gpujob-*.
var serviceAccounts = []string{"gpujob-gateway", "gpujob-sweep", "gpujob-exporter"}

// isServiceAccount reports whether name is one of gpujob's own accounts.
func isServiceAccount(name string) bool {
	return strings.HasPrefix(name, "gpujob-")
}

// UserRefusedError is a task whose user the plugin config does not allow
// in its namespace.
type UserRefusedError struct {
	User, Source, Namespace string
	Option                  string   // allowed_users or namespace_users["ns"]
	Allowed                 []string // that option's users
	ServiceAccount          bool
}

func (e *UserRefusedError) Error() string {
	if e.ServiceAccount {
		return fmt.Sprintf("the task would run as %q (%s), one of gpujob's own service accounts (gpujob-*), which no task may use: "+
			"give the task another `user`", e.User, e.Source)
	}
	return fmt.Sprintf("the task would run as %q (%s), which the gpujob driver does not allow in namespace %q: "+
		"%s is %q; give the task a user from it, or add %q to %s in the client's "+
		`plugin "nomad-driver-gpujob" { config { ... } } block`, e.User, e.Source, e.Namespace, e.Option, e.Allowed, e.User, e.Option)
}

// RootRefusedError is a task that would run as root on a client whose
// plugin config does not allow it.
type RootRefusedError struct {
	User   string // the user name that resolved to UID 0
	Source string // where the name came from, for the message
}

func (e *RootRefusedError) Error() string {
	return fmt.Sprintf("the task would run as root (user %q, %s), which the gpujob driver refuses: "+
		"give the task a `user` that is not root, or set allow_root = true in the client's "+
		`plugin "nomad-driver-gpujob" { config { ... } } block`, e.User, e.Source)
}

// lookupFunc finds a user by name (os/user.Lookup outside tests).
type lookupFunc func(name string) (*user.User, error)

// resolveIdentity decides who the ranks of a task whose Nomad `user` is
// taskUser run as. A nil credential means the supervisor's own identity
// (the client's), used when the client cannot switch users.
//
// The rules:
//   - a root client runs the ranks as taskUser, else as the plugin's
//     default_user; whichever it is, a name that resolves to UID 0 (root,
//     or an alias such as toor) needs allow_root, which covers every road
//     to root: the task's user, default_user, or both empty (which
//     validate turns into nobody);
//   - a client that is not root cannot switch: the ranks run as the client's
//     own user, default_user does not apply, and a task that names another
//     user is refused rather than silently run as someone else.
func resolveIdentity(taskUser string, p identityPolicy, lookup lookupFunc) (*supervisor.Credential, error) {
	if p.ClientUID != 0 {
		if taskUser == "" {
			return nil, nil
		}
		u, err := lookupUser(taskUser, "the task's user", lookup)
		if err != nil {
			return nil, err
		}
		if u.Uid != strconv.Itoa(p.ClientUID) {
			return nil, fmt.Errorf("the task asks for user %q, but the Nomad client runs as UID %d, not root, and cannot start processes as another user: "+
				"run the client as root, or leave the task's user out (its processes then run as the client's own user)", taskUser, p.ClientUID)
		}
		return nil, nil
	}

	allowed, option := p.AllowedUsers, "allowed_users"
	nsUsers, nsListed := p.NamespaceUsers[p.Namespace]
	if nsListed {
		allowed, option = nsUsers, fmt.Sprintf("namespace_users[%q]", p.Namespace)
	}
	name, source := taskUser, "the task's user"
	switch {
	case name != "":
	case nsListed && len(nsUsers) > 0:
		name, source = nsUsers[0], "the first of the plugin's "+option
	default:
		name, source = p.DefaultUser, "the plugin's default_user"
		if name == "" {
			name = defaultUser
		}
	}
	u, err := lookupUser(name, source, lookup)
	if err != nil {
		return nil, err
	}
	cred, err := credentialOf(u)
	if err != nil {
		return nil, err
	}
	if cred.UID == 0 {
		if !p.AllowRoot {
			return nil, &RootRefusedError{User: name, Source: source}
		}
		return cred, nil
	}
	// By UID, so that another name of the same account is the same user.
	if isServiceAccount(u.Username) || isServiceAccount(name) || sameUIDAsAny(cred.UID, serviceAccounts, lookup) {
		return nil, &UserRefusedError{User: name, Source: source, ServiceAccount: true}
	}
	if p.AllowedUsers == nil && !nsListed {
		return cred, nil // no allow-list configured (a policy built by hand)
	}
	if !sameUIDAsAny(cred.UID, allowed, lookup) {
		return nil, &UserRefusedError{User: name, Source: source, Namespace: p.Namespace, Option: option, Allowed: allowed}
	}
	return cred, nil
}

// sameUIDAsAny reports whether uid is the UID of one of the named users
// (names this client lacks are skipped).
func sameUIDAsAny(uid uint32, names []string, lookup lookupFunc) bool {
	for _, n := range names {
		u, err := lookup(n)
		if err != nil {
			continue
		}
		if id, err := strconv.ParseUint(u.Uid, 10, 32); err == nil && uint32(id) == uid {
			return true
		}
	}
	return false
}

func lookupUser(name, source string, lookup lookupFunc) (*user.User, error) {
	u, err := lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return nil, fmt.Errorf("%s %q does not exist on this client", source, name)
		}
		return nil, fmt.Errorf("looking up %s %q: %w", source, name, err)
	}
	return u, nil
}

// credentialOf is u's UID, primary GID and supplementary groups, and its
// home directory if it exists (nobody's /nonexistent does not: the
// supervisor then gives the ranks the task's local directory as HOME).
func credentialOf(u *user.User) (*supervisor.Credential, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: UID %q is not a number", u.Username, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: GID %q is not a number", u.Username, u.Gid)
	}
	c := &supervisor.Credential{User: u.Username, UID: uint32(uid), GID: uint32(gid)}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("user %q: listing its groups: %w", u.Username, err)
	}
	seen := map[uint32]bool{}
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("user %q: group ID %q is not a number", u.Username, s)
		}
		if !seen[uint32(g)] {
			seen[uint32(g)] = true
			c.Groups = append(c.Groups, uint32(g))
		}
	}
	if len(c.Groups) == 0 {
		c.Groups = []uint32{c.GID}
	}
	if fi, err := os.Stat(u.HomeDir); err == nil && fi.IsDir() && u.HomeDir != "/" {
		c.Home = u.HomeDir
	}
	return c, nil
}
