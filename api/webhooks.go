package api

import (
	"net/url"
	"strings"
	"time"
)

// ResourceWebhook is the IAM resource type of webhook endpoints and their deliveries.
const ResourceWebhook = "compute-webhook"

// The webhooks group: endpoints a tenant's events are sent to, signed (docs/events.md).
var (
	WebhooksCreate       = NewMethod[CreateWebhook, Webhook]("webhooks", "create", true, ResourceWebhook, "v0.3", "Send a tenant's events to an HTTPS endpoint, signed; the signing secret is shown once.")
	WebhooksList         = NewMethod[ListWebhooks, Page[Webhook]]("webhooks", "list", false, ResourceWebhook, "v0.3", "List a tenant's webhook endpoints.")
	WebhooksDelete       = NewMethod[WebhookRef, Webhook]("webhooks", "delete", true, ResourceWebhook, "v0.3", "Delete a webhook endpoint and its pending deliveries.")
	WebhooksTest         = NewMethod[WebhookRef, WebhookTest]("webhooks", "test", true, ResourceWebhook, "v0.3", "Send a webhook.test event to one endpoint, through the same path as every event.")
	WebhooksRotateSecret = NewMethod[RotateWebhookSecret, Webhook]("webhooks", "rotateSecret", true, ResourceWebhook, "v0.3", "Give an endpoint a new signing secret (shown once); the old one keeps signing for a while.")
	WebhooksDeliveries   = NewMethod[ListWebhookDeliveries, Page[WebhookDelivery]]("webhooks", "deliveries", false, ResourceWebhook, "v0.3", "List an endpoint's deliveries, newest first, with their attempts.")
	WebhooksRedeliver    = NewMethod[RedeliverWebhook, WebhookDelivery]("webhooks", "redeliver", true, ResourceWebhook, "v0.3", "Send a delivery again now, whatever its state.")
)

// WebhookMethods returns the webhooks group.
func WebhookMethods() []MethodInfo { return infos(webhookTable()) }

func webhookTable() []Describer {
	return []Describer{WebhooksCreate, WebhooksList, WebhooksDelete, WebhooksTest, WebhooksRotateSecret, WebhooksDeliveries, WebhooksRedeliver}
}

// Limits of webhooks.
const (
	MaxWebhookURL        = 2048
	MaxWebhookEventTypes = 32
	// DefaultWebhookKeepPrevious is how long a rotated-out secret keeps signing by default.
	DefaultWebhookKeepPrevious = 24 * time.Hour
	MaxWebhookKeepPrevious     = 7 * 24 * time.Hour
	// WebhookSecretPrefix starts every signing secret (the Standard Webhooks form: whsec_ and
	// the key's base64).
	WebhookSecretPrefix = "whsec_"
)

// Webhook is an endpoint events are delivered to. Secret is set only in the answers of
// webhooks.create and webhooks.rotateSecret: it is shown once.
type Webhook struct {
	ID          string   `json:"id"`
	TenantID    string   `json:"tenantId"`
	URL         string   `json:"url"`
	Description string   `json:"description,omitempty"`
	EventTypes  []string `json:"eventTypes"` // empty: every event type
	// After is the event id deliveries start after: events from the endpoint's creation on.
	After     int64     `json:"after"`
	CreatedBy string    `json:"createdBy"`
	CreatedAt time.Time `json:"createdAt"`
	// PreviousSecretUntil is set while a rotated-out secret still signs, beside the new one.
	PreviousSecretUntil *time.Time `json:"previousSecretUntil,omitempty"`
	Secret              string     `json:"secret,omitempty"`
}

// ForReplay is what an idempotent replay keeps: the endpoint without its secret.
func (w Webhook) ForReplay() any {
	w.Secret = ""
	return w
}

// CreateWebhook is the input of webhooks.create.
type CreateWebhook struct {
	TenantID string `json:"tenantId,omitempty"`
	URL      string `json:"url"`
	// EventTypes filters what is sent: event types (node.offline) or prefixes ending in "."
	// (reservation.). Empty: every event.
	EventTypes  []string `json:"eventTypes,omitempty"`
	Description string   `json:"description,omitempty"`
}

// Validate implements the input check. Whether the URL's host may be reached (a private or
// loopback address) is the server's to say.
func (in CreateWebhook) Validate() error {
	if err := ValidateWebhookURL("url", in.URL); err != nil {
		return err
	}
	if len(in.EventTypes) > MaxWebhookEventTypes {
		return InvalidField("eventTypes", "has %d entries; the limit is %d", len(in.EventTypes), MaxWebhookEventTypes)
	}
	for _, t := range in.EventTypes {
		if len(t) > 128 || !eventTypeFilter.MatchString(t) {
			return InvalidField("eventTypes", "%q is not an event type (e.g. node.offline) or a prefix (e.g. node.)", t)
		}
	}
	return ValidateText("description", in.Description, MaxDescription)
}

// ValidateWebhookURL checks that u is an absolute http or https URL with a host, no user
// information and no fragment.
func ValidateWebhookURL(field, u string) error {
	if u == "" {
		return InvalidField(field, "is required: the endpoint's https URL")
	}
	if len(u) > MaxWebhookURL {
		return InvalidField(field, "is %d bytes long; the limit is %d", len(u), MaxWebhookURL)
	}
	p, err := url.Parse(u)
	switch {
	case err != nil:
		return InvalidField(field, "%q is not a URL", u)
	case p.Scheme != "https" && p.Scheme != "http":
		return InvalidField(field, "%q: the scheme must be https (or http), not %q", u, p.Scheme)
	case p.Hostname() == "":
		return InvalidField(field, "%q has no host", u)
	case p.User != nil:
		return InvalidField(field, "%q carries user information; endpoints authenticate requests by their signature", u)
	case p.Fragment != "" || strings.Contains(u, "#"):
		return InvalidField(field, "%q has a fragment, which is never sent", u)
	}
	return nil
}

// ListWebhooks is the input of webhooks.list.
type ListWebhooks struct {
	TenantID string `json:"tenantId,omitempty"`
	PageRequest
}

// Validate implements the input check.
func (in ListWebhooks) Validate() error { return in.PageRequest.Validate() }

// WebhookRef names an endpoint by id.
type WebhookRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Webhook  string `json:"webhook"`
}

// Validate implements the input check.
func (in WebhookRef) Validate() error { return ValidateRef("webhook", in.Webhook) }

// WebhookTest is the answer of webhooks.test: a webhook.test event was written, to be
// delivered to this endpoint alone; its delivery is listed by webhooks.deliveries with
// eventType webhook.test once the event has its place in the log (within a second).
type WebhookTest struct {
	WebhookID string `json:"webhookId"`
	EventType string `json:"eventType"`
}

// RotateWebhookSecret is the input of webhooks.rotateSecret.
type RotateWebhookSecret struct {
	TenantID string `json:"tenantId,omitempty"`
	Webhook  string `json:"webhook"`
	// KeepPrevious is how long the old secret keeps signing beside the new one (every delivery
	// carries both signatures meanwhile): default 24h, at most 168h; "0s" drops it at once.
	KeepPrevious string `json:"keepPrevious,omitempty"`
}

// Validate implements the input check.
func (in RotateWebhookSecret) Validate() error {
	if err := ValidateRef("webhook", in.Webhook); err != nil {
		return err
	}
	_, err := in.KeepFor()
	return err
}

// KeepFor is how long the previous secret keeps signing.
func (in RotateWebhookSecret) KeepFor() (time.Duration, error) {
	if in.KeepPrevious == "" {
		return DefaultWebhookKeepPrevious, nil
	}
	d, err := time.ParseDuration(in.KeepPrevious)
	if err != nil || d < 0 {
		return 0, InvalidField("keepPrevious", "%q is not a duration such as 24h (or 0s)", in.KeepPrevious)
	}
	if d > MaxWebhookKeepPrevious {
		return 0, InvalidField("keepPrevious", "%s is longer than %s", in.KeepPrevious, MaxWebhookKeepPrevious)
	}
	return d, nil
}

// The states of a delivery.
const (
	DeliveryPending   = "pending"   // not yet answered with a 2xx; retried with backoff
	DeliveryDelivered = "delivered" // the endpoint answered 2xx
	DeliveryDead      = "dead"      // given up: still failing after the dead-letter age
)

// WebhookDelivery is one event's delivery to one endpoint.
type WebhookDelivery struct {
	ID            int64            `json:"id"`
	WebhookID     string           `json:"webhookId"`
	EventID       int64            `json:"eventId"`
	EventType     string           `json:"eventType"`
	Subject       string           `json:"subject"`
	State         string           `json:"state"`
	Attempts      int              `json:"attempts"`
	CreatedAt     time.Time        `json:"createdAt"`
	NextAttemptAt *time.Time       `json:"nextAttemptAt,omitempty"`
	DeliveredAt   *time.Time       `json:"deliveredAt,omitempty"`
	LastAttempts  []WebhookAttempt `json:"lastAttempts"` // the latest first, at most MaxListedAttempts
}

// MaxListedAttempts bounds the attempts a delivery lists.
const MaxListedAttempts = 10

// WebhookAttempt is one try of a delivery.
type WebhookAttempt struct {
	At      time.Time `json:"at"`
	Status  int       `json:"status,omitempty"` // the HTTP status; 0 when there was no answer
	Error   string    `json:"error,omitempty"`
	Seconds float64   `json:"seconds"`
}

// ListWebhookDeliveries is the input of webhooks.deliveries.
type ListWebhookDeliveries struct {
	TenantID  string `json:"tenantId,omitempty"`
	Webhook   string `json:"webhook"`
	State     string `json:"state,omitempty"`                // pending, delivered or dead
	EventID   int64  `json:"eventId,omitempty" input:"int8"` // the deliveries of one event
	EventType string `json:"eventType,omitempty"`            // the deliveries of events of one type
	PageRequest
}

// Validate implements the input check.
func (in ListWebhookDeliveries) Validate() error {
	var typ error
	if in.EventType != "" && (len(in.EventType) > 128 || !eventTypeFilter.MatchString(in.EventType) || strings.HasSuffix(in.EventType, ".")) {
		typ = InvalidField("eventType", "%q is not an event type (e.g. node.offline)", in.EventType)
	}
	var id error
	if in.EventID < 0 {
		id = InvalidField("eventId", "must be an event id, got %d", in.EventID)
	}
	return first(ValidateRef("webhook", in.Webhook),
		ValidateEnum("state", in.State, DeliveryPending, DeliveryDelivered, DeliveryDead), typ, id,
		in.PageRequest.Validate())
}

// RedeliverWebhook is the input of webhooks.redeliver.
type RedeliverWebhook struct {
	TenantID string `json:"tenantId,omitempty"`
	Delivery int64  `json:"delivery" input:"int8"`
}

// Validate implements the input check.
func (in RedeliverWebhook) Validate() error {
	if in.Delivery <= 0 {
		return InvalidField("delivery", "is required: a delivery's id (webhooks.deliveries)")
	}
	return nil
}
