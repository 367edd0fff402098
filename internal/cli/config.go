package cli

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// applyConfigFile sets the flags of f named in the YAML file at path
// (keys are flag names, e.g. data-dir: /var/lib/tenure), except those
// given on the command line: flags win. A key that names no flag, or a
// value the flag does not accept, is an error naming the file and key.
// Values are scalars; a flag of the form id=addr,... (bootstrap-peers)
// also takes a mapping, and any flag a list, joined with commas.
func applyConfigFile(f *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the config file: %w", err)
	}
	var doc map[string]yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config file %s is not valid YAML: %v", path, err)
	}
	for _, key := range slices.Sorted(maps.Keys(doc)) {
		fl := f.Lookup(key)
		if fl == nil || key == "config" {
			return fmt.Errorf("config file %s: %q is not a flag of this command (see --help)", path, key)
		}
		if fl.Changed {
			continue // the command line wins
		}
		node := doc[key]
		value, err := configValue(&node)
		if err != nil {
			return fmt.Errorf("config file %s: %s: %v", path, key, err)
		}
		if err := f.Set(key, value); err != nil {
			return fmt.Errorf("config file %s: %s: %v", path, key, err)
		}
	}
	return nil
}

// configValue renders a YAML value as the flag's command-line text.
func configValue(n *yaml.Node) (string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value, nil
	case yaml.SequenceNode:
		var parts []string
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("a list of plain values is expected")
			}
			parts = append(parts, c.Value)
		}
		return strings.Join(parts, ","), nil
	case yaml.MappingNode:
		var parts []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || v.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("a mapping of plain values is expected")
			}
			parts = append(parts, k.Value+"="+v.Value)
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("unsupported value")
}
