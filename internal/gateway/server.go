package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"time"
)

// Server is the http.Server of the gateway's public listener, with its
// limits: ReadHeaderTimeout ends a slowloris, IdleTimeout an idle
// keep-alive connection, MaxHeaderBytes a header flood (431). It sets no
// ReadTimeout or WriteTimeout of the whole request: a body's pace is
// checked as it arrives (readBody), and an answer's as it leaves
// (copyFlushing), since a legitimate large upload or a long stream of
// tokens would outlast any fixed deadline that stops an attacker in time.
func (g *Gateway) Server() *http.Server {
	return &http.Server{
		Handler:           g,
		ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
		IdleTimeout:       g.cfg.IdleTimeout,
		MaxHeaderBytes:    g.cfg.MaxHeaderBytes,
	}
}

// AdminHandler serves the gateway's metrics (MetricsPath), its figures per
// service (StatsPath) and its health, for the admin listener: loopback by
// default, since the metrics and stats name every tenant's services and
// traffic. With a token, every request must carry it as a bearer token
// (the admin listener may then listen beyond loopback, for a Prometheus).
func (g *Gateway) AdminHandler(token string) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			secret, _ := bearerSecret(r.Header.Get("Authorization"))
			got := sha256.Sum256([]byte(secret))
			if secret == "" || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="gpujob-gateway-admin"`)
				writeError(w, http.StatusUnauthorized, "the gateway's admin endpoints need its admin token")
				return
			}
		}
		switch r.URL.Path {
		case MetricsPath:
			g.metricsHandler.ServeHTTP(w, r)
		case StatsPath:
			g.serveStats(w)
		case HealthPath:
			g.serveHealth(w)
		default:
			writeError(w, http.StatusNotFound, "the admin listener serves "+MetricsPath+", "+StatsPath+" and "+HealthPath)
		}
	})
}

// AdminServer is the http.Server of the admin listener.
func (g *Gateway) AdminServer(token string) *http.Server {
	return &http.Server{
		Handler:           g.AdminHandler(token),
		ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       g.cfg.IdleTimeout,
		MaxHeaderBytes:    g.cfg.MaxHeaderBytes,
	}
}
