package kubernetes

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Image is the image the manifests run, the one make image builds
// (scripts/image.sh's IMAGE).
const Image = "localhost/gpucoord:dev"

// Entrypoint is where the image keeps gpucoord: its entrypoint, and the
// command every container of the manifests runs.
const Entrypoint = "/usr/local/bin/gpucoord"

//go:embed *.yaml
var files embed.FS

// Files returns the manifests' directory: kustomization.yaml and the
// resources it lists.
func Files() fs.FS { return files }

// Kustomization is the part of kustomization.yaml this package reads; a
// field it does not know fails Objects, so that a typo is not ignored.
type Kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

// Object is one object of a manifest, decoded into its k8s.io/api type
// (a pointer: *appsv1.StatefulSet, *batchv1.Job, ...).
type Object struct {
	// File is the manifest it comes from.
	File string
	// Kind is its kind, as the manifest says.
	Kind string
	// Name is its metadata.name.
	Name string
	// Value is the decoded object.
	Value any
}

// kinds are the types the manifests may use, by apiVersion and kind.
var kinds = map[string]func() any{
	"v1/Namespace":                       func() any { return new(corev1.Namespace) },
	"v1/Service":                         func() any { return new(corev1.Service) },
	"v1/Secret":                          func() any { return new(corev1.Secret) },
	"v1/ConfigMap":                       func() any { return new(corev1.ConfigMap) },
	"apps/v1/StatefulSet":                func() any { return new(appsv1.StatefulSet) },
	"batch/v1/Job":                       func() any { return new(batchv1.Job) },
	"policy/v1/PodDisruptionBudget":      func() any { return new(policyv1.PodDisruptionBudget) },
	"networking.k8s.io/v1/NetworkPolicy": func() any { return new(networkingv1.NetworkPolicy) },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return new(Kustomization) },
}

// ReadKustomization decodes kustomization.yaml strictly.
func ReadKustomization() (*Kustomization, error) {
	b, err := fs.ReadFile(files, "kustomization.yaml")
	if err != nil {
		return nil, err
	}
	var k Kustomization
	if err := strict(b, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	return &k, nil
}

// Objects decodes every object of every resource kustomization.yaml
// lists, strictly: an unknown kind, an unknown or repeated field, or a
// value of the wrong type is an error naming the file and the object.
func Objects() ([]Object, error) {
	k, err := ReadKustomization()
	if err != nil {
		return nil, err
	}
	var out []Object
	for _, f := range k.Resources {
		b, err := fs.ReadFile(files, f)
		if err != nil {
			return nil, fmt.Errorf("kustomization.yaml lists %s: %w", f, err)
		}
		objs, err := Decode(f, b)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// strict decodes the YAML document b into v as the API server decodes
// a request: field names case-sensitive, and an unknown or repeated field
// an error that names its path.
func strict(b []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(b) // a repeated key fails here
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(j, v, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// docSeparator splits a YAML stream into its documents.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Decode decodes every document of the YAML stream b (from file) strictly
// into its k8s.io/api type. Documents holding only comments are skipped.
func Decode(file string, b []byte) ([]Object, error) {
	var out []Object
	for i, doc := range docSeparator.Split(string(b), -1) {
		if isBlank(doc) {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		mk, ok := kinds[meta.APIVersion+"/"+meta.Kind]
		if !ok {
			return nil, fmt.Errorf("%s: document %d: %s %q of apiVersion %q is not a kind these manifests use", file, i+1, meta.Kind, meta.Metadata.Name, meta.APIVersion)
		}
		v := mk()
		if err := strict([]byte(doc), v); err != nil {
			return nil, fmt.Errorf("%s: %s %q: %w", file, meta.Kind, meta.Metadata.Name, err)
		}
		out = append(out, Object{File: file, Kind: meta.Kind, Name: meta.Metadata.Name, Value: v})
	}
	return out, nil
}

// isBlank says whether a YAML document holds nothing but comments and
// space.
func isBlank(doc string) bool {
	for line := range strings.Lines(doc) {
		if t := bytes.TrimSpace([]byte(line)); len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}
