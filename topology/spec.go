package topology

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// decodeStrict decodes one YAML document of `field: value` lines into v, a
// pointer to a struct, rejecting unknown fields. Its errors are one line
// that names the line and the field as the file spells them, and the kind
// of value wanted, never a Go type.
func decodeStrict(data []byte, v any) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return errors.New(yamlMessage(err))
	}
	if len(doc.Content) == 0 {
		return errors.New("empty document")
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want field: value lines, got %s", top.Line, describeNode(top))
	}
	fields := yamlFields(reflect.TypeOf(v).Elem())
	for i := 0; i+1 < len(top.Content); i += 2 {
		key, val := top.Content[i], top.Content[i+1]
		typ, ok := fields[key.Value]
		if !ok {
			return fmt.Errorf("line %d: unknown field %q (known: %s)", key.Line, key.Value, strings.Join(sortedKeys(fields), ", "))
		}
		if err := val.Decode(reflect.New(typ).Interface()); err != nil || truncated(val, typ) {
			return fmt.Errorf("line %d: %s: want %s, got %s", val.Line, key.Value, describeKind(typ), describeNode(val))
		}
	}
	// Each field decodes alone; decode the whole document for what only
	// the whole can get wrong (a field given twice).
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty document")
		}
		return errors.New(yamlMessage(err))
	}
	return nil
}

// truncated reports whether a whole-number field was given a fraction,
// which yaml.v3 would silently truncate.
func truncated(n *yaml.Node, t reflect.Type) bool {
	if describeKind(t) != "a whole number" {
		return false
	}
	var f float64
	return n.Decode(&f) == nil && f != math.Trunc(f)
}

// yamlFields maps the YAML field names of struct type t, inline fields
// flattened, to their Go types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "-":
			continue
		case opts == "inline" && f.Type.Kind() == reflect.Struct:
			for k, v := range yamlFields(f.Type) {
				out[k] = v
			}
			continue
		case name == "":
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// describeKind names the kind of value a field of type t takes, in a YAML
// writer's terms.
func describeKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "text"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return "a " + t.Kind().String()
}

// describeNode names what a YAML node holds: a scalar's text, quoted, or
// its kind.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

// yamlMessage turns a yaml.v3 error into one line without the "yaml:"
// prefix or Go type names.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, m := range te.Errors {
			if j := strings.Index(m, " in type "); j >= 0 {
				m = m[:j]
			}
			msgs[i] = m
		}
		return strings.Join(msgs, "; ")
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return strings.Join(strings.Fields(msg), " ")
}
