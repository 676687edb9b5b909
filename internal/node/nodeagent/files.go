package nodeagent

import (
	"math/rand/v2"
	"net"
	"net/http"
)

// GatewayHTTP returns an HTTP client that reaches gateways as the node id (its certificate, the
// machine CA as the only root, TLS 1.3), through the proxy the environment names: for what a
// gateway serves beside the session, such as the release repository.
func GatewayHTTP(id Identity) (*http.Client, error) {
	tc, err := tlsConfig(id)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: dialTimeout}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: dialTimeout,
		ForceAttemptHTTP2:     true,
	}}, nil
}

// GatewayAddress is the gateway a node reaches: override when set, else one of its join's.
func GatewayAddress(id Identity, override string) string {
	if override != "" || len(id.Gateways) == 0 {
		return override
	}
	return id.Gateways[rand.N(len(id.Gateways))]
}
