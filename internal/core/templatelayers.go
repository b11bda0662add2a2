package core

import "time"

// TemplateLayer is a template a node built over the API (or copied from
// the node that did), as it advertises it in its heartbeat so that other
// nodes copy it: its tree is stored as a snapshot manifest and 1 MiB
// chunks named by their SHA-256, in the node's snapshot store (and the
// shared one when the node has it), so whoever copies it checks every
// byte against Manifest.
type TemplateLayer struct {
	Ref    string `json:"ref"`    // the template's name, "~project~name" for a project's (TemplateRef)
	Digest string `json:"digest"` // the builder's tree digest
	// Manifest is the digest of the tree's manifest.
	Manifest  string            `json:"manifest"`
	Source    string            `json:"source"`
	SizeBytes int64             `json:"size_bytes"`
	Files     int               `json:"files"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	Cmd       []string          `json:"cmd,omitempty"`
	Ready     []string          `json:"ready,omitempty"`
	// CreatedAt is when the builder pointed the name at the tree: of two
	// builds of a name, the later wins on every node.
	CreatedAt time.Time `json:"created_at"`
	// Deleted marks a tombstone: the name was deleted at CreatedAt, and
	// every node drops an older build of it (one that was away at the
	// delete included) instead of copying it back to the others.
	Deleted bool `json:"deleted,omitempty"`
}
