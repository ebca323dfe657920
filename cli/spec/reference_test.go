package spec

import (
	"maps"
	"strings"
	"testing"
	"time"
)

func TestReferenceCoversTheSchemas(t *testing.T) {
	blocks, err := Reference()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range blocks {
		names = append(names, b.Name)
	}
	if got := strings.Join(names, " "); got != "train sweep service variable" {
		t.Fatalf("top-level blocks %q", got)
	}
	// Every attribute the train schema accepts is listed, in its order.
	var attrs []string
	for _, a := range blocks[0].Attributes {
		attrs = append(attrs, a.Name)
	}
	var want []string
	for _, a := range trainSchema.Attributes {
		want = append(want, a.Name)
	}
	if strings.Join(attrs, ",") != strings.Join(want, ",") {
		t.Errorf("train attributes %v, want %v", attrs, want)
	}
}

func TestReferenceDefaults(t *testing.T) {
	blocks, err := Reference()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"train.workers":                        "1",
		"train.rendezvous_timeout":             `"5m"`,
		"train.resources.memory":               "2048",
		"service.route.timeout":                `"1m"`,
		"service.health.initial_delay":         `"1m"`,
		"sweep.search.algorithm":               `"random"`,
		`sweep.early_stop "asha".grace_period`: "1",
	}
	for path, want := range cases {
		a, ok := findAttr(blocks, path)
		if !ok {
			t.Errorf("%s: not in the reference", path)
			continue
		}
		if a.Default != want {
			t.Errorf("%s: default %q, want %q", path, a.Default, want)
		}
	}
	if a, _ := findAttr(blocks, "train.checkpoint.every"); !a.Required {
		t.Error("checkpoint.every is required by the schema but not marked so")
	}
}

func TestReferenceFindsDrift(t *testing.T) {
	missing := maps.Clone(fieldDocs)
	delete(missing, "train.workdir")
	if _, err := reference(missing); err == nil || !strings.Contains(err.Error(), "train.workdir") {
		t.Errorf("an undescribed attribute: err = %v, want one naming train.workdir", err)
	}
	extra := maps.Clone(fieldDocs)
	extra["train.nonsense"] = fieldDoc{typ: "string", desc: "x"}
	if _, err := reference(extra); err == nil || !strings.Contains(err.Error(), "train.nonsense") {
		t.Errorf("a described attribute no schema has: err = %v, want one naming train.nonsense", err)
	}
}

func TestDurString(t *testing.T) {
	for d, want := range map[string]string{"5m0s": `"5m"`, "2s": `"2s"`, "1h0m0s": `"1h"`, "1m30s": `"1m30s"`} {
		dur, err := time.ParseDuration(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := durString(dur); got != want {
			t.Errorf("durString(%s) = %s, want %s", d, got, want)
		}
	}
}

// findAttr finds an attribute by its path, "train.resources.memory".
func findAttr(blocks []*Block, path string) (Attribute, bool) {
	for _, b := range blocks {
		for _, a := range b.Attributes {
			if b.Path+"."+a.Name == path {
				return a, true
			}
		}
		if a, ok := findAttr(b.Blocks, path); ok {
			return a, true
		}
	}
	return Attribute{}, false
}
