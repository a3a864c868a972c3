# The Jaeger image: Jaeger v2 (collector-based) v1.75.0 built static from its
# pinned module (deploy/tools/jaeger), with an OTLP -> memory -> query
# configuration (jaeger.yaml), the real jaeger-ui's built files (from the Go
# module github.com/tonistiigi/jaeger-ui-rest, as a tar that ADD unpacks;
# served by Jaeger itself via ui.assets_path), plus httpcheck for the health
# check, FROM scratch.
FROM scratch
ENV PATH=/usr/local/bin
COPY tmp /tmp
ADD jaeger-ui.tar /usr/share/jaeger-ui/
COPY jaeger.yaml /etc/jaeger/config.yaml
COPY jaeger httpcheck /usr/local/bin/
USER 65532:65532
EXPOSE 4317 4318 16686 13133
CMD ["jaeger", "--config", "/etc/jaeger/config.yaml"]
