{{/* Backups (docs/operations.md, "Backups and restore"). */}}

{{/* backup.interval ("90s", "30m", "1h") in seconds, for the placement service's flag. */}}
{{- define "o41.backupIntervalSeconds" -}}
{{- $given := .Values.backup.interval | toString -}}
{{- $count := regexFind "^[0-9]+" $given -}}
{{- $unit := trimPrefix $count $given -}}
{{- mul (int $count) (get (dict "s" 1 "m" 60 "h" 3600) $unit) -}}
{{- end }}
