package main

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestCLIReferenceHidesTheHost(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &cobra.Command{Use: "gpujob"}
	run := &cobra.Command{Use: "run", Run: func(*cobra.Command, []string) {}}
	run.Flags().String("id", host+"-"+strconv.Itoa(os.Getpid()), "the ID")
	cmd.AddCommand(run)
	files, err := CLIReference(cmd)
	if err != nil {
		t.Fatal(err)
	}
	page := string(files["docs/reference/cli/gpujob_run.md"])
	if !strings.Contains(page, `(default "<hostname>-<pid>")`) {
		t.Errorf("the host's name and pid are not replaced:\n%s", page)
	}
	if _, ok := files["docs/reference/cli/gpujob.md"]; !ok {
		t.Errorf("no page for the root command: %v", len(files))
	}
	if strings.Contains(page, "Auto generated") {
		t.Error("the page has cobra's dated footer")
	}
}

func TestGenerateIsStable(t *testing.T) {
	a, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("%d files, then %d", len(a), len(b))
	}
	for name, content := range a {
		if string(b[name]) != string(content) {
			t.Errorf("%s differs between two runs", name)
		}
	}
	if _, ok := a[SpecsFile]; !ok {
		t.Errorf("no %s", SpecsFile)
	}
}

func TestStaleAndWrite(t *testing.T) {
	root := t.TempDir()
	files := map[string][]byte{CLIDir + "/gpujob.md": []byte("a\n"), SpecsFile: []byte("b\n")}
	stale, err := Stale(root, files)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 2 {
		t.Errorf("an empty tree: stale %v, want both files missing", stale)
	}
	if err := Write(root, files); err != nil {
		t.Fatal(err)
	}
	if stale, _ := Stale(root, files); len(stale) != 0 {
		t.Errorf("after Write: stale %v", stale)
	}
	old := filepath.Join(root, CLIDir, "gpujob_gone.md")
	if err := os.WriteFile(old, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, SpecsFile), []byte("edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stale, _ = Stale(root, files)
	want := []string{CLIDir + "/gpujob_gone.md (no command generates it)", SpecsFile}
	if !slices.Equal(stale, want) {
		t.Errorf("stale %v, want %v", stale, want)
	}
	if err := Write(root, files); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("Write kept a page no command generates: %v", err)
	}
}
