package core

import "regexp"

// Templates belong to a scope: public (builtins and what an operator
// publishes) or one project. Nodes know a template by its ref: a public
// template's ref is its name; a project template's is "~project~name".
// '~' is in neither a template name nor a project id, so a ref can never be
// spelled by a client as a name, and no two scopes share a ref.

var templateRefRE = regexp.MustCompile(`^~([a-z0-9_-]{1,64})~(.+)$`)

// TemplateRef is the node-level name of name in projectID's scope ("" =
// public).
func TemplateRef(projectID, name string) string {
	if projectID == "" {
		return name
	}
	return "~" + projectID + "~" + name
}

// SplitTemplateRef returns the scope ("" = public) and name of a ref.
func SplitTemplateRef(ref string) (projectID, name string) {
	if m := templateRefRE.FindStringSubmatch(ref); m != nil {
		return m[1], m[2]
	}
	return "", ref
}

// ValidTemplateName reports whether name (with an optional :tag) is a
// template name a client may use.
func ValidTemplateName(name string) bool { return templateNameRE.MatchString(name) }

// TemplateKey is the ref of the template a sandbox was created from
// (records from before template scopes have only the public name).
func (sb Sandbox) TemplateKey() string {
	if sb.TemplateRef != "" {
		return sb.TemplateRef
	}
	return sb.Template
}

// TemplateKey is the ref of the template the snapshot's sandbox ran.
func (s Snapshot) TemplateKey() string {
	if s.TemplateRef != "" {
		return s.TemplateRef
	}
	return s.Template
}
