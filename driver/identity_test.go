package driver

import (
	"errors"
	"os"
	"os/user"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/plugins/base"

	"github.com/gpujob/gpujob/internal/pluginconfig"
	"github.com/gpujob/gpujob/internal/testpriv"
)

// decodePluginConfig turns the body of an agent's plugin "nomad-driver-gpujob"
// config block into Config as Nomad does (HCL1, the plugin's hclspec with
// its defaults, msgpack), then validates it as SetConfig does.
func decodePluginConfig(t *testing.T, body string) (Config, error) {
	t.Helper()
	data, err := pluginconfig.Encode(configSpec, body)
	if errors.Is(err, pluginconfig.ErrInput) {
		t.Fatal(err)
	}
	if err != nil {
		return Config{}, err
	}
	var cfg Config
	if err := base.MsgPackDecode(data, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg, cfg.validate()
}

func TestPluginConfigUserSettings(t *testing.T) {
	cases := []struct {
		name      string
		body      string
		user      string
		allowRoot bool
		wantErr   string
	}{
		{"defaults: nobody, root refused", ``, "nobody", false, ""},
		{"another default user", "default_user = \"trainer\"\nallowed_users = [\"trainer\"]", "trainer", false, ""},
		{"a default user that is not allowed", `default_user = "trainer"`, "", false, `default_user: "trainer" is not in allowed_users ["nobody"]`},
		{"a service account is never allowed", `allowed_users = ["nobody", "gpujob-gateway"]`, "", false,
			`allowed_users: "gpujob-gateway" is one of gpujob's own service accounts`},
		{"nor in a namespace", "namespace_users = {\n  team-a = [\"gpujob-sweep\"]\n}", "", false,
			`namespace_users["team-a"]: "gpujob-sweep" is one of gpujob's own service accounts`},
		{"an empty namespace list", "namespace_users = {\n  team-a = []\n}", "", false, `namespace_users["team-a"]: an empty list`},
		{"namespace users", "namespace_users = {\n  team-a = [\"alice\"]\n}", "nobody", false, ""},
		{"root allowed", `allow_root = true`, "nobody", true, ""},
		{"root as the default with allow_root", "default_user = \"root\"\nallow_root = true", "root", true, ""},
		{"root as the default without allow_root", `default_user = "root"`, "", false, "default_user: \"root\" needs allow_root = true"},
		{"allow_root must be a bool", `allow_root = "maybe"`, "", false, "allow_root"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := decodePluginConfig(t, c.body)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.name == "defaults: nobody, root refused" && (len(cfg.AllowedUsers) != 1 || cfg.AllowedUsers[0] != "nobody") {
				t.Errorf("allowed_users %q, want the default [\"nobody\"]", cfg.AllowedUsers)
			}
			if c.name == "namespace users" && (len(cfg.NamespaceUsers["team-a"]) != 1 || cfg.NamespaceUsers["team-a"][0] != "alice") {
				t.Errorf("namespace_users %v", cfg.NamespaceUsers)
			}
			if cfg.DefaultUser != c.user || cfg.AllowRoot != c.allowRoot {
				t.Fatalf("default_user %q allow_root %v, want %q %v", cfg.DefaultUser, cfg.AllowRoot, c.user, c.allowRoot)
			}
		})
	}
}

// fakeUsers is a passwd of its own, so the table does not depend on the
// machine's.
func fakeUsers(name string) (*user.User, error) {
	users := map[string]*user.User{
		"root":   {Uid: "0", Gid: "0", Username: "root", HomeDir: "/root"},
		"toor":   {Uid: "0", Gid: "0", Username: "toor", HomeDir: "/root"},
		"nobody": {Uid: "65534", Gid: "65534", Username: "nobody", HomeDir: "/nonexistent"},
		"alice":  {Uid: "1000", Gid: "1000", Username: "alice", HomeDir: "/nonexistent/alice"},
		"bob":    {Uid: "1001", Gid: "1001", Username: "bob", HomeDir: "/nonexistent/bob"},
		// Another name of alice's account.
		"alice2":         {Uid: "1000", Gid: "1000", Username: "alice2", HomeDir: "/nonexistent/alice"},
		"messagebus":     {Uid: "100", Gid: "102", Username: "messagebus", HomeDir: "/nonexistent"},
		"gpujob-gateway": {Uid: "990", Gid: "990", Username: "gpujob-gateway", HomeDir: "/nonexistent"},
		// An account of another name with the gateway's UID.
		"gw-alias": {Uid: "990", Gid: "990", Username: "gw-alias", HomeDir: "/nonexistent"},
		"broken":   {Uid: "x", Gid: "1", Username: "broken"},
	}
	if u, ok := users[name]; ok {
		return u, nil
	}
	return nil, user.UnknownUserError(name)
}

func TestResolveIdentity(t *testing.T) {
	rootClient := identityPolicy{DefaultUser: "nobody", ClientUID: 0, AllowedUsers: []string{"nobody", "alice"}}
	tenants := identityPolicy{DefaultUser: "nobody", ClientUID: 0, AllowedUsers: []string{"nobody"},
		NamespaceUsers: map[string][]string{"team-a": {"alice"}, "team-b": {"bob"}}}
	inA, inB := tenants, tenants
	inA.Namespace, inB.Namespace = "team-a", "team-b"
	allowRoot := identityPolicy{DefaultUser: "nobody", AllowRoot: true, ClientUID: 0}
	rootDefault := identityPolicy{DefaultUser: "root", AllowRoot: false, ClientUID: 0}
	userClient := identityPolicy{DefaultUser: "nobody", ClientUID: 1000}
	cases := []struct {
		name     string
		taskUser string
		policy   identityPolicy
		wantUID  int // -1: no credential (the supervisor's own user)
		wantErr  string
	}{
		{"no user: the default, nobody", "", rootClient, 65534, ""},
		{"the task's user wins over the default", "alice", rootClient, 1000, ""},
		{"root refused", "root", rootClient, 0, "would run as root (user \"root\", the task's user)"},
		{"an alias of root refused too", "toor", rootClient, 0, "would run as root (user \"toor\""},
		{"root as the default refused, naming it", "", rootDefault, 0, "the plugin's default_user"},
		{"refusal names the knob", "root", rootClient, 0, "allow_root = true"},
		{"root allowed with allow_root", "root", allowRoot, 0, ""},
		{"an empty default falls back to nobody", "", identityPolicy{ClientUID: 0}, 65534, ""},
		{"unknown user", "mallory", rootClient, 0, "the task's user \"mallory\" does not exist on this client"},
		{"unknown default user", "", identityPolicy{DefaultUser: "gpujob", ClientUID: 0}, 0, "default_user \"gpujob\" does not exist"},
		{"bad passwd entry", "broken", rootClient, 0, "is not a number"},
		{"a user not allowed, naming the option", "messagebus", rootClient, 0,
			`would run as "messagebus" (the task's user), which the gpujob driver does not allow in namespace "": allowed_users is ["nobody" "alice"]`},
		{"another name of an allowed account", "alice2", rootClient, 1000, ""},
		{"a service account, even if listed", "gpujob-gateway", identityPolicy{AllowedUsers: []string{"gpujob-gateway"}}, 0,
			"one of gpujob's own service accounts"},
		{"another name of a service account", "gw-alias", identityPolicy{AllowedUsers: []string{"gw-alias"}}, 0,
			"one of gpujob's own service accounts"},
		{"a namespace's default is its first user", "", inA, 1000, ""},
		{"a namespace's own user", "bob", inB, 1001, ""},
		{"another namespace's user refused", "alice", inB, 0, `namespace_users["team-b"] is ["bob"]`},
		{"the global list does not apply to a listed namespace", "nobody", inA, 0, `namespace_users["team-a"] is ["alice"]`},
		{"an unlisted namespace uses allowed_users", "", tenants, 65534, ""},
		{"client not root, no user: the client's own", "", userClient, -1, ""},
		{"client not root, its own user named", "alice", userClient, -1, ""},
		{"client not root cannot switch", "nobody", userClient, 0, "cannot start processes as another user"},
		{"client not root cannot switch to root either", "root", userClient, 0, "cannot start processes as another user"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cred, err := resolveIdentity(c.taskUser, c.policy, fakeUsers)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.wantUID < 0 && cred != nil:
				t.Fatalf("credential %+v, want none (the supervisor's own user)", cred)
			case c.wantUID >= 0 && (cred == nil || int(cred.UID) != c.wantUID):
				t.Fatalf("credential %+v, want UID %d", cred, c.wantUID)
			}
		})
	}
}

func TestRootRefusalIsTyped(t *testing.T) {
	_, err := resolveIdentity("root", identityPolicy{DefaultUser: "nobody"}, fakeUsers)
	var refused *RootRefusedError
	if !errors.As(err, &refused) || refused.User != "root" {
		t.Fatalf("error %v, want a RootRefusedError for root", err)
	}
}

func TestCredentialOfTheMachinesNobody(t *testing.T) {
	u, err := user.Lookup("nobody")
	if err != nil {
		testpriv.Skip(t, "no nobody user here")
	}
	c, err := credentialOf(u)
	if err != nil {
		t.Fatal(err)
	}
	if c.User != "nobody" || c.UID == 0 || len(c.Groups) == 0 {
		t.Fatalf("credential %+v", c)
	}
	// Root's group must never be among a task user's groups (Nomad 1.6's
	// executor puts GID 0 there).
	for _, g := range c.Groups {
		if g == 0 {
			t.Fatalf("nobody's groups %v include GID 0", c.Groups)
		}
	}
	// A home that does not exist (nobody's /nonexistent) is none: the
	// task's local dir serves.
	if _, err := os.Stat(u.HomeDir); err != nil && c.Home != "" {
		t.Fatalf("home %q for nobody, whose %s does not exist; want none", c.Home, u.HomeDir)
	}
}
