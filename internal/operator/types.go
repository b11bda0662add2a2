package operator

import (
	"encoding/json"
	"time"
)

// The agent-sandbox v1beta1 objects, with the fields the operator reads
// or writes. The pod template is kept as raw JSON so that what a warm pool
// or a claim copies from a SandboxTemplate into a Sandbox is the user's
// text, unknown fields included; podView parses the part SPACE honours.

// ObjectMeta is the metadata every object carries.
type ObjectMeta struct {
	Name              string            `json:"name,omitempty"`
	GenerateName      string            `json:"generateName,omitempty"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Generation        int64             `json:"generation,omitempty"`
	CreationTimestamp *time.Time        `json:"creationTimestamp,omitempty"`
	DeletionTimestamp *time.Time        `json:"deletionTimestamp,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
	Finalizers        []string          `json:"finalizers,omitempty"`
	OwnerReferences   []OwnerReference  `json:"ownerReferences,omitempty"`
}

// OwnerReference points at an owning object (garbage collection).
type OwnerReference struct {
	APIVersion         string `json:"apiVersion"`
	Kind               string `json:"kind"`
	Name               string `json:"name"`
	UID                string `json:"uid"`
	Controller         *bool  `json:"controller,omitempty"`
	BlockOwnerDeletion *bool  `json:"blockOwnerDeletion,omitempty"`
}

// Condition is metav1.Condition.
type Condition struct {
	Type               string    `json:"type"`
	Status             string    `json:"status"` // True, False, Unknown
	ObservedGeneration int64     `json:"observedGeneration,omitempty"`
	LastTransitionTime time.Time `json:"lastTransitionTime"`
	Reason             string    `json:"reason"`
	Message            string    `json:"message"`
}

// PodMetadata is the pod template's metadata.
type PodMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Sandbox is agents.x-k8s.io/v1beta1 Sandbox.
type Sandbox struct {
	APIVersion string        `json:"apiVersion,omitempty"`
	Kind       string        `json:"kind,omitempty"`
	Metadata   ObjectMeta    `json:"metadata"`
	Spec       SandboxSpec   `json:"spec"`
	Status     SandboxStatus `json:"status,omitzero"`
}

// SandboxSpec is the blueprint (pod template, volume claims, service),
// the lifecycle and the operating mode.
type SandboxSpec struct {
	PodTemplate          json.RawMessage   `json:"podTemplate,omitempty"`
	VolumeClaimTemplates []json.RawMessage `json:"volumeClaimTemplates,omitempty"`
	Service              *bool             `json:"service,omitempty"`
	ShutdownTime         *time.Time        `json:"shutdownTime,omitempty"`
	ShutdownPolicy       *string           `json:"shutdownPolicy,omitempty"`
	OperatingMode        string            `json:"operatingMode,omitempty"`
}

// SandboxStatus is what the operator reports about a Sandbox.
type SandboxStatus struct {
	ServiceFQDN   string      `json:"serviceFQDN,omitempty"`
	Service       string      `json:"service,omitempty"`
	Conditions    []Condition `json:"conditions,omitempty"`
	LabelSelector string      `json:"selector,omitempty"`
	PodIPs        []string    `json:"podIPs,omitempty"`
	NodeName      string      `json:"nodeName,omitempty"`
}

// SandboxTemplate is extensions.agents.x-k8s.io/v1beta1 SandboxTemplate.
type SandboxTemplate struct {
	APIVersion string              `json:"apiVersion,omitempty"`
	Kind       string              `json:"kind,omitempty"`
	Metadata   ObjectMeta          `json:"metadata"`
	Spec       SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateSpec is the blueprint plus the template's policies.
type SandboxTemplateSpec struct {
	PodTemplate                json.RawMessage   `json:"podTemplate,omitempty"`
	VolumeClaimTemplates       []json.RawMessage `json:"volumeClaimTemplates,omitempty"`
	Service                    *bool             `json:"service,omitempty"`
	NetworkPolicy              *NetworkPolicy    `json:"networkPolicy,omitempty"`
	NetworkPolicyManagement    string            `json:"networkPolicyManagement,omitempty"`
	EnvVarsInjectionPolicy     string            `json:"envVarsInjectionPolicy,omitempty"`
	VolumeClaimTemplatesPolicy string            `json:"volumeClaimTemplatesPolicy,omitempty"`
}

// NetworkPolicy is the template's restricted NetworkPolicySpec: ingress
// and egress rules of networking.k8s.io/v1.
type NetworkPolicy struct {
	Ingress []json.RawMessage `json:"ingress,omitempty"`
	Egress  []EgressRule      `json:"egress,omitempty"`
}

// EgressRule is networking.k8s.io/v1 NetworkPolicyEgressRule.
type EgressRule struct {
	Ports []json.RawMessage `json:"ports,omitempty"`
	To    []struct {
		IPBlock *struct {
			CIDR   string   `json:"cidr"`
			Except []string `json:"except,omitempty"`
		} `json:"ipBlock,omitempty"`
		PodSelector       json.RawMessage `json:"podSelector,omitempty"`
		NamespaceSelector json.RawMessage `json:"namespaceSelector,omitempty"`
	} `json:"to,omitempty"`
}

// SandboxClaim is extensions.agents.x-k8s.io/v1beta1 SandboxClaim.
type SandboxClaim struct {
	APIVersion string             `json:"apiVersion,omitempty"`
	Kind       string             `json:"kind,omitempty"`
	Metadata   ObjectMeta         `json:"metadata"`
	Spec       SandboxClaimSpec   `json:"spec"`
	Status     SandboxClaimStatus `json:"status,omitzero"`
}

// SandboxClaimSpec names the warm pool, the claim's lifecycle and what it
// adds to the sandbox.
type SandboxClaimSpec struct {
	WarmPoolRef struct {
		Name string `json:"name"`
	} `json:"warmPoolRef"`
	Lifecycle             *ClaimLifecycle   `json:"lifecycle,omitempty"`
	AdditionalPodMetadata PodMetadata       `json:"additionalPodMetadata,omitzero"`
	Env                   []ClaimEnvVar     `json:"env,omitempty"`
	VolumeClaimTemplates  []json.RawMessage `json:"volumeClaimTemplates,omitempty"`
}

// ClaimLifecycle is when and how a claim expires.
type ClaimLifecycle struct {
	ShutdownTime            *time.Time `json:"shutdownTime,omitempty"`
	TTLSecondsAfterFinished *int32     `json:"ttlSecondsAfterFinished,omitempty"`
	ShutdownPolicy          string     `json:"shutdownPolicy,omitempty"`
}

// ClaimEnvVar is one variable a claim injects.
type ClaimEnvVar struct {
	Name          string `json:"name"`
	Value         string `json:"value"`
	ContainerName string `json:"containerName,omitempty"`
}

// SandboxClaimStatus mirrors the sandbox's readiness.
type SandboxClaimStatus struct {
	Conditions []Condition `json:"conditions,omitempty"`
	Sandbox    struct {
		Name   string   `json:"name,omitempty"`
		PodIPs []string `json:"podIPs,omitempty"`
	} `json:"sandbox,omitzero"`
}

// SandboxWarmPool is extensions.agents.x-k8s.io/v1beta1 SandboxWarmPool.
type SandboxWarmPool struct {
	APIVersion string         `json:"apiVersion,omitempty"`
	Kind       string         `json:"kind,omitempty"`
	Metadata   ObjectMeta     `json:"metadata"`
	Spec       WarmPoolSpec   `json:"spec"`
	Status     WarmPoolStatus `json:"status,omitzero"`
}

// WarmPoolSpec is the pool's size, template and update strategy.
type WarmPoolSpec struct {
	Replicas    *int32 `json:"replicas,omitempty"`
	TemplateRef struct {
		Name string `json:"name"`
	} `json:"sandboxTemplateRef"`
	UpdateStrategy *struct {
		Type string `json:"type,omitempty"`
	} `json:"updateStrategy,omitempty"`
}

// WarmPoolStatus counts the pool's sandboxes.
type WarmPoolStatus struct {
	Replicas           int32  `json:"replicas,omitempty"`
	ReadyReplicas      int32  `json:"readyReplicas,omitempty"`
	Selector           string `json:"selector,omitempty"`
	ObservedGeneration int64  `json:"observedGeneration,omitempty"`
}

// Well-known names: agent-sandbox's labels and annotations, and SPACE's.
const (
	APIGroup    = "agents.x-k8s.io"
	ExtGroup    = "extensions.agents.x-k8s.io"
	Version     = "v1beta1"
	CondReady   = "Ready"
	CondSuspend = "Suspended"

	LabelWarmPool        = "agents.x-k8s.io/warm-pool-sandbox"
	LabelClaimUID        = "agents.x-k8s.io/claim-uid"
	LabelLaunchType      = "agents.x-k8s.io/launch-type"
	AnnotTemplateRef     = "agents.x-k8s.io/sandbox-template-ref"
	AnnotClaimSandbox    = "agents.x-k8s.io/sandbox-name"
	AnnotSpaceID         = "space-sandbox.dev/sandbox-id"
	AnnotSpaceTemplate   = "space-sandbox.dev/template"
	AnnotSpaceBuildfile  = "space-sandbox.dev/buildfile"
	AnnotSpaceNetwork    = "space-sandbox.dev/network"
	AnnotSpaceSuspend    = "space-sandbox.dev/suspend" // pause (default) or hibernate
	AnnotSpaceDataURL    = "space-sandbox.dev/data-url"
	AnnotSpaceSecret     = "space-sandbox.dev/session-secret"
	Finalizer            = "space-sandbox.dev/operator"
	metadataKeyUID       = "k8s.uid"
	metadataKeyName      = "k8s.name"
	sessionRefreshBefore = time.Hour
)
