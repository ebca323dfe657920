package main

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestCheckLinks(t *testing.T) {
	fsys := fstest.MapFS{
		"README.md": {Data: []byte("# gpujob\n\n[guide](docs/guide.md#two-words) [gone](docs/gone.md) [web](https://example.com/x)\n" +
			"```sh\n[not a link](nowhere.md)\n```\n`[code](nowhere.md)` [self](#gpujob) [bad](#nope)\n")},
		"docs/guide.md": {Data: []byte("# Guide\n\n## Two words\n\n## Two words\n\n[up](../README.md#gpujob) [dup](#two-words-1) [dir](../docs) [miss](#three)\n")},
	}
	broken, err := CheckLinks(fsys)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(broken, "\n")
	for _, want := range []string{
		"README.md:3: docs/gone.md: no such file or directory",
		"README.md:7: #nope: no heading #nope in README.md",
		"docs/guide.md:7: #three: no heading #three in docs/guide.md",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if len(broken) != 3 {
		t.Errorf("%d broken links, want 3:\n%s", len(broken), got)
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Container members (`image`)":                     "container-members-image",
		"Configuration reference — `nomad-device-gpujob`": "configuration-reference--nomad-device-gpujob",
		"ACLs and TLS":                     "acls-and-tls",
		`train "<name>"`:                   "train-name",
		"Warm restarts: [`preload`](x.md)": "warm-restarts-preload",
		"Isolation: `gpujob` next to `exec` and `raw_exec`": "isolation-gpujob-next-to-exec-and-raw_exec",
	} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}
