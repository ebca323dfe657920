package pylaunch

import (
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		command string
		args    []string
		want    Launch
		err     string
	}{
		{"/usr/bin/python3", []string{"train.py", "--lr", "1"}, Launch{Target: "train.py", Argv: []string{"train.py", "--lr", "1"}}, ""},
		{"python3.11", []string{"-u", "-B", "t.py"}, Launch{Target: "t.py", Argv: []string{"t.py"}, Unbuffered: true, NoBytecode: true}, ""},
		{"/usr/bin/python3", []string{"-m", "pkg.mod", "x"}, Launch{Module: true, Target: "pkg.mod", Argv: []string{"-m", "x"}}, ""},
		{"/usr/bin/torchrun", []string{"t.py"}, Launch{}, "needs a Python interpreter"},
		{"/bin/sh", []string{"-c", "python3 t.py"}, Launch{}, "needs a Python interpreter"},
		{"python3", []string{"-X", "dev", "t.py"}, Launch{}, `args[0]: interpreter option "-X"`},
		{"python3", []string{"-c", "print(1)"}, Launch{}, `"-c" is not supported`},
		{"python3", []string{"-m"}, Launch{}, "-m needs a module"},
		{"python3", nil, Launch{}, "no script"},
	} {
		got, err := Parse(tc.command, tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s %v: error %v, want %q", tc.command, tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || strconv.Quote(strings.Join(got.Argv, " ")) != strconv.Quote(strings.Join(tc.want.Argv, " ")) ||
			got.Target != tc.want.Target || got.Module != tc.want.Module || got.Unbuffered != tc.want.Unbuffered || got.NoBytecode != tc.want.NoBytecode {
			t.Errorf("%s %v: %+v, %v; want %+v", tc.command, tc.args, got, err, tc.want)
		}
	}
}

func TestModule(t *testing.T) {
	for name, want := range map[string]bool{"torch": true, "torch.distributed": true, "_x.y_2": true,
		"": false, "2x": false, "torch.": false, "os; import evil": false, "a..b": false, "-m": false} {
		if Module(name) != want {
			t.Errorf("Module(%q) = %v", name, !want)
		}
	}
}
