# The Jaeger image: Jaeger v2 (collector-based) built static from its pinned
# module (deploy/tools/jaeger), with an OTLP -> memory -> query configuration
# (jaeger.yaml), plus httpcheck for the health check, FROM scratch. The UI is a
# placeholder when Jaeger is built this way; the query API (/api/traces/{id})
# is complete.
FROM scratch
ENV PATH=/usr/local/bin
COPY tmp /tmp
COPY jaeger.yaml /etc/jaeger/config.yaml
COPY jaeger httpcheck /usr/local/bin/
USER 65532:65532
EXPOSE 4317 4318 16686 13133
CMD ["jaeger", "--config", "/etc/jaeger/config.yaml"]
