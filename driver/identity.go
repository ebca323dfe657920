package driver

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"

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
	// ClientUID is the driver's effective UID. Only root can start
	// processes as another user.
	ClientUID int
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

	name, source := taskUser, "the task's user"
	if name == "" {
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
	if cred.UID == 0 && !p.AllowRoot {
		return nil, &RootRefusedError{User: name, Source: source}
	}
	return cred, nil
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
