package main

import (
	"flag"
	"log/slog"
	"os"
	"strings"

	"github.com/space-sandbox/space/internal/logx"
	"github.com/space-sandbox/space/internal/server"
)

// logOpts are the operational log's flags of `space server` and `space node`.
type logOpts struct{ format, level string }

func logFlags(fs *flag.FlagSet) *logOpts {
	o := &logOpts{}
	fs.StringVar(&o.format, "log-format", envOr("SPACE_LOG_FORMAT", "text"), "log format on standard error: "+strings.Join(logx.Formats, "|")+" (json: one object per line; default $SPACE_LOG_FORMAT, else text)")
	fs.StringVar(&o.level, "log-level", envOr("SPACE_LOG_LEVEL", "info"), "least severe records logged: "+strings.Join(logx.Levels, "|")+" (debug adds health-check requests; default $SPACE_LOG_LEVEL, else info)")
	return o
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// apply builds the logger on standard error and gives it to cfg (its
// Logf lines become records too) and to the log and slog packages'
// defaults, so nothing is printed past it.
func (o *logOpts) apply(cfg *server.Config) error {
	l, err := logx.New(os.Stderr, o.format, o.level)
	if err != nil {
		return usageErr(err)
	}
	slog.SetDefault(l)
	cfg.Logger, cfg.Logf = l, logx.Logf(l)
	return nil
}
