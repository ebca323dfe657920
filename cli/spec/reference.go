package spec

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// Block documents one block of a spec file: its attributes and nested
// blocks, in the order of the parser's schema. Reference builds it from the
// schemas the parser decodes with, so a field the parser accepts cannot be
// missing from the documentation, nor one it refuses documented.
type Block struct {
	// Path is the block's place in a spec file: "train", "train.resources",
	// `sweep.early_stop "asha"`.
	Path string
	// Name is the block type; Labels its label names ("name", "rule").
	Name   string
	Labels []string
	// Description says what the block is for.
	Description string
	// SameAs names the block whose fields this one takes, when it is that
	// block again (a sweep's train block is a train block without a label).
	SameAs     string
	Attributes []Attribute
	Blocks     []*Block
}

// Attribute documents one attribute of a block.
type Attribute struct {
	Name     string
	Type     string // HCL type as a user writes it: number, string, list(string), …
	Required bool
	// Default is the value an absent attribute takes, as written in a spec,
	// or a sentence when it depends on other fields; "" when there is none.
	Default     string
	Description string
}

// fieldDoc is the hand-written half of an attribute's or block's reference:
// what the schema cannot say.
type fieldDoc struct {
	typ, def, desc string
}

// blockSchemas maps a block's path to the schema the parser decodes it
// with. A path missing here is a block Reference does not descend into.
var blockSchemas = map[string]*hcl.BodySchema{
	"variable":                  variableSchema,
	"train":                     trainSchema,
	"train.artifact":            artifactSchema,
	"train.resources":           resourcesSchema,
	"train.gpu":                 gpuSchema,
	"train.checkpoint":          checkpointSchema,
	"train.image_pull":          imagePullSchema,
	"train.image_pull.auth":     authSchema,
	"sweep":                     sweepSchema,
	"sweep.param":               paramSchema,
	"sweep.objective":           objectiveSchema,
	"sweep.search":              searchSchema,
	`sweep.early_stop "asha"`:   earlyStopSchemas[RuleASHA],
	`sweep.early_stop "median"`: earlyStopSchemas[RuleMedian],
	"service":                   serviceSchema,
	"service.replicas":          replicasSchema,
	"service.health":            healthSchema,
	"service.update":            updateSchema,
	"service.autoscale":         autoscaleSchema,
	"service.route":             routeSchema,
	"service.route.rate_limit":  rateLimitSchema,
	"service.resources":         resourcesSchema,
	"service.gpu":               gpuSchema,
}

// sameAs are blocks documented as another block: a sweep's train block is
// decoded with the train schema.
var sameAs = map[string]string{"sweep.train": "train"}

// labelled expands a block type whose schema depends on its label into one
// documented block per label.
var labelled = map[string][]string{
	"sweep.early_stop": {RuleASHA, RuleMedian},
}

// topLevel are the blocks of a spec file, in the order the reference lists
// them.
var topLevel = []string{"train", "sweep", "service", "variable"}

// Reference documents every block and attribute a spec file may hold, from
// the parser's schemas and the descriptions beside them. It fails when the
// two disagree: an attribute or block of a schema without a description, or
// a description of something no schema has.
func Reference() ([]*Block, error) { return reference(fieldDocs) }

// reference is Reference with the descriptions given.
func reference(fieldDocs map[string]fieldDoc) ([]*Block, error) {
	used := map[string]bool{}
	var problems []string
	var build func(path, name string, labels []string) *Block
	build = func(path, name string, labels []string) *Block {
		used[path] = true
		doc, ok := fieldDocs[path]
		if !ok {
			problems = append(problems, fmt.Sprintf("block %s has no description", path))
		}
		b := &Block{Path: path, Name: name, Labels: labels, Description: doc.desc}
		if to, ok := sameAs[path]; ok {
			b.SameAs = to
			return b
		}
		schema, ok := blockSchemas[path]
		if !ok {
			problems = append(problems, fmt.Sprintf("block %s has no schema", path))
			return b
		}
		for _, a := range schema.Attributes {
			ap := path + "." + a.Name
			used[ap] = true
			d, ok := fieldDocs[ap]
			if !ok || d.typ == "" || d.desc == "" {
				problems = append(problems, fmt.Sprintf("attribute %s has no type or description", ap))
			}
			b.Attributes = append(b.Attributes, Attribute{Name: a.Name, Type: d.typ, Required: a.Required, Default: d.def, Description: d.desc})
		}
		for _, h := range schema.Blocks {
			if rules, ok := labelled[path+"."+h.Type]; ok {
				used[path+"."+h.Type] = true
				for _, r := range rules {
					b.Blocks = append(b.Blocks, build(fmt.Sprintf("%s.%s %q", path, h.Type, r), h.Type, []string{r}))
				}
				continue
			}
			b.Blocks = append(b.Blocks, build(path+"."+h.Type, h.Type, h.LabelNames))
		}
		return b
	}
	top := map[string]hcl.BlockHeaderSchema{}
	for _, h := range fileSchema.Blocks {
		top[h.Type] = h
	}
	var out []*Block
	for _, name := range topLevel {
		h, ok := top[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("block %s is not a block of a spec file", name))
			continue
		}
		out = append(out, build(name, name, h.LabelNames))
		delete(top, name)
	}
	for name := range top {
		problems = append(problems, fmt.Sprintf("block %s of a spec file is not in the reference", name))
	}
	for path := range fieldDocs {
		if !used[path] {
			problems = append(problems, fmt.Sprintf("%s is described but no schema has it", path))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return out, fmt.Errorf("spec reference out of step with the parser: %s", strings.Join(problems, "; "))
	}
	return out, nil
}
