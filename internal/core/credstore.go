package core

import "context"

// SealedCredential is an egress credential as the database keeps it: the
// binding in clear (it is not secret), the secret sealed under a data key
// of its own, and that data key wrapped by an operator key the database
// never holds (KeyID names it, so keys can rotate).
type SealedCredential struct {
	Credential Credential
	KeyID      string
	WrappedKey []byte // the data key, sealed by the operator key KeyID
	Sealed     []byte // the secret, sealed by the data key
}

// CredentialStore keeps sealed credentials, shared by every replica of a
// cluster (SQLite and PostgreSQL implement it). It never sees a secret or
// a key in clear.
type CredentialStore interface {
	// InsertCredential stores a new record; ErrConflict when its id
	// exists, ErrExhausted when its project already has maxPerProject.
	InsertCredential(ctx context.Context, c SealedCredential, maxPerProject int) error
	// GetCredentialRecord returns one record of a project (projectID "":
	// of any project); ErrNotFound when there is none.
	GetCredentialRecord(ctx context.Context, projectID, id string) (SealedCredential, error)
	// ListCredentialRecords returns up to limit records with ids after
	// afterID, by id, of one project (projectID "": of every project).
	ListCredentialRecords(ctx context.Context, projectID, afterID string, limit int) ([]SealedCredential, error)
	// DeleteCredentialRecord removes a project's record; ErrNotFound when
	// there is none.
	DeleteCredentialRecord(ctx context.Context, projectID, id string) error
	// RewrapCredential replaces a record's wrapped data key, only while
	// it is still wrapped by fromKeyID; it reports whether it did.
	RewrapCredential(ctx context.Context, id, fromKeyID, toKeyID string, wrapped []byte) (bool, error)
}
