package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"

	"github.com/gpujob/gpujob/cli/command/root"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
)

// CLIDir and SpecsFile are where the generated references live, relative
// to the repository's root (slash-separated).
const (
	CLIDir    = "docs/reference/cli"
	SpecsFile = "docs/reference/specs.md"
)

// Generate returns every generated file by its slash-separated path from
// the repository's root.
func Generate() (map[string][]byte, error) {
	files, err := CLIReference(gpujobCommand())
	if err != nil {
		return nil, err
	}
	specs, err := SpecReference()
	if err != nil {
		return nil, err
	}
	files[SpecsFile] = specs
	return files, nil
}

// gpujobCommand is the gpujob command tree as the binary builds it, with the
// completion command cobra adds when it runs.
func gpujobCommand() *cobra.Command {
	io, _, _, _ := iostreams.Test()
	cmd := root.NewCmd(&factory.Factory{IO: io, Now: time.Now})
	cmd.InitDefaultCompletionCmd()
	cmd.DisableAutoGenTag = true
	return cmd
}

// CLIReference renders one markdown page per command, as cobra's
// GenMarkdownTree names and links them, with flag defaults that depend on
// the host (its name, the process, the executable's path) replaced by
// placeholders.
func CLIReference(cmd *cobra.Command) (map[string][]byte, error) {
	hostValues := hostDependent()
	files := map[string][]byte{}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		c.DisableAutoGenTag = true
		scrubDefaults(c.LocalFlags(), hostValues)
		scrubDefaults(c.InheritedFlags(), hostValues)
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.IsAdditionalHelpTopicCommand() {
				continue
			}
			if err := walk(sub); err != nil {
				return err
			}
		}
		var b bytes.Buffer
		if err := doc.GenMarkdownCustom(c, &b, func(s string) string { return s }); err != nil {
			return fmt.Errorf("markdown of %q: %w", c.CommandPath(), err)
		}
		name := strings.ReplaceAll(c.CommandPath(), " ", "_") + ".md"
		files[path.Join(CLIDir, name)] = b.Bytes()
		return nil
	}
	if err := walk(cmd); err != nil {
		return nil, err
	}
	return files, nil
}

// placeholder is a host-dependent value and what the reference shows
// instead.
type placeholder struct{ value, shown string }

// hostDependent lists the values of this host and process that flag
// defaults may hold, longest first so that a path is replaced before a
// part of it.
func hostDependent() []placeholder {
	var ps []placeholder
	if exe, err := os.Executable(); err == nil {
		ps = append(ps, placeholder{exe, "<gpujob binary>"})
	}
	if wd, err := os.Getwd(); err == nil && wd != "/" {
		ps = append(ps, placeholder{wd, "<working directory>"})
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		ps = append(ps, placeholder{h, "<hostname>"})
	}
	ps = append(ps, placeholder{"-" + strconv.Itoa(os.Getpid()), "-<pid>"})
	sort.SliceStable(ps, func(i, j int) bool { return len(ps[i].value) > len(ps[j].value) })
	return ps
}

// scrubDefaults replaces host-dependent values in the defaults of flags.
func scrubDefaults(fs *pflag.FlagSet, ps []placeholder) {
	fs.VisitAll(func(f *pflag.Flag) {
		for _, p := range ps {
			f.DefValue = strings.ReplaceAll(f.DefValue, p.value, p.shown)
		}
	})
}

// Write writes the generated files under root, and removes files of the
// CLI reference that are no longer generated (a command that went away).
func Write(root string, files map[string][]byte) error {
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	extra, err := notGenerated(root, files)
	if err != nil {
		return err
	}
	for _, name := range extra {
		if err := os.Remove(filepath.Join(root, filepath.FromSlash(name))); err != nil {
			return fmt.Errorf("remove %s: %w", name, err)
		}
	}
	return nil
}

// Stale lists the generated files whose copy under root differs or is
// missing, and the files of the CLI reference no command generates.
func Stale(root string, files map[string][]byte) ([]string, error) {
	var stale []string
	for name, content := range files {
		got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			stale = append(stale, name+" (missing)")
		case err != nil:
			return nil, fmt.Errorf("read %s: %w", name, err)
		case !bytes.Equal(got, content):
			stale = append(stale, name)
		}
	}
	extra, err := notGenerated(root, files)
	if err != nil {
		return nil, err
	}
	for _, name := range extra {
		stale = append(stale, name+" (no command generates it)")
	}
	sort.Strings(stale)
	return stale, nil
}

// notGenerated lists the markdown files in the CLI reference's directory
// that files does not hold.
func notGenerated(root string, files map[string][]byte) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(CLIDir)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", CLIDir, err)
	}
	var extra []string
	for _, e := range entries {
		name := path.Join(CLIDir, e.Name())
		if _, ok := files[name]; !ok && !e.IsDir() && strings.HasSuffix(e.Name(), ".md") {
			extra = append(extra, name)
		}
	}
	return extra, nil
}
